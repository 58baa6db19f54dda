// The xfs backend on a loop-mounted XFS filesystem: project ids set on scopes and inherited by
// everything made in them, scopes adopted, reflink clones that share extents and take the
// destination's project id, and (this kernel has no XFS quota support) the degraded state: the
// precise reason in hwinfo and limits refused with kUnsupported. With $SLUICE_XFS_MOUNT_OPTS
// containing `prjquota` on a quota-enabled kernel, LimitsEnforcedOrRefused checks EDQUOT instead.
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <gtest/gtest.h>

#include "common/thread_pool.h"
#include "support/loop_fs.h"
#include "volume/registry.h"
#include "volume/xfs/xfs_fs.h"
#include "volume/xfs/xfs_volume.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;

QuotaScopeId Scope(char c) {
  return QuotaScopeId::Parse("user:" + std::string(32, c)).value();
}
VFolderId VF(const QuotaScopeId& qs, char c) {
  return VFolderId::Parse(qs.ToString() + "/" + std::string(32, c)).value();
}

bool QuotaKernel() {
  const char* o = std::getenv("SLUICE_XFS_MOUNT_OPTS");
  return o && std::string(o).find("prjquota") != std::string::npos;
}

std::string ReadFile(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& p, const std::string& data) {
  std::ofstream(p, std::ios::binary) << data;
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7) % 251);
  return s;
}

// The project id (and PROJINHERIT) of a path, through FS_IOC_FSGETXATTR.
xfs::ProjectAttr Project(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  EXPECT_GE(fd, 0) << p;
  if (fd < 0) return {};
  auto a = xfs::GetProject(fd);
  ::close(fd);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : xfs::ProjectAttr{};
}

// Whether every extent of the file is marked shared (a reflink whose source still exists).
bool AllExtentsShared(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  constexpr int kMax = 32;
  alignas(struct fiemap) char buf[sizeof(struct fiemap) + kMax * sizeof(struct fiemap_extent)] = {};
  auto* fm = reinterpret_cast<struct fiemap*>(buf);
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = kMax;
  int rc = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  ::close(fd);
  if (rc != 0 || fm->fm_mapped_extents == 0) return false;
  for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i)
    if (!(fm->fm_extents[i].fe_flags & FIEMAP_EXTENT_SHARED)) return false;
  return true;
}

class XfsVolumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& loop = test::LoopFs::Xfs();
    ASSERT_TRUE(loop.ok()) << loop.error();
    base_ = loop.MakeTempDir("xfs-test");
    ASSERT_FALSE(base_.empty());
    mount_ = base_ + "/vol";
    fs::create_directory(mount_);
    pool_ = std::make_unique<ThreadPool>("scan", 4);
    vol_ = Open(mount_);
    ASSERT_NE(vol_, nullptr);
  }
  void TearDown() override {
    vol_.reset();
    pool_.reset();
    if (!base_.empty()) fs::remove_all(base_);
  }
  std::unique_ptr<XfsVolume> Open(const std::string& path) {
    VolumeConfig cfg;
    cfg.name = "xf";
    cfg.backend = "xfs";
    cfg.path = path;
    auto v = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{pool_.get()});
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    if (!v.ok()) return nullptr;
    Status init = (*v)->Init();
    EXPECT_TRUE(init.ok()) << init.ToString();
    if (!init.ok()) return nullptr;
    return std::unique_ptr<XfsVolume>(static_cast<XfsVolume*>(v->release()));
  }
  uint32_t IdFile(const QuotaScopeId& qs) {
    return static_cast<uint32_t>(
        std::stoul(ReadFile(vol_->quota().ScopePath(qs) + "/" + XfsQuotaModel::kProjectIdFile)));
  }

  std::string base_, mount_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<XfsVolume> vol_;
};

TEST_F(XfsVolumeTest, ScopeProjectIdIsSetAndInherited) {
  auto a = Scope('a'), b = Scope('b');
  ASSERT_TRUE(vol_->quota().CreateScope(a, std::nullopt).ok());
  ASSERT_TRUE(vol_->quota().CreateScope(b, std::nullopt).ok());
  uint32_t ida = IdFile(a), idb = IdFile(b);
  EXPECT_GE(ida, XfsVolume::kFirstProjectId);
  EXPECT_NE(ida, idb);
  auto attr = Project(vol_->quota().ScopePath(a));
  EXPECT_EQ(attr.project_id, ida);
  EXPECT_TRUE(attr.inherit);
  EXPECT_EQ(Project(vol_->quota().ScopePath(b)).project_id, idb);
  EXPECT_TRUE(fs::exists(vol_->ProjectCounterFile()));
  // Everything made in the scope, by Sluice or by users, inherits the id.
  auto vf = VF(a, '1');
  ASSERT_TRUE(vol_->CreateVFolder(vf, 0755, false, std::nullopt).ok());
  std::string p = vol_->VFolderPath(vf);
  fs::create_directories(p + "/d/e");
  WriteFile(p + "/d/e/f.bin", "data");
  for (const std::string& q : {p, p + "/d", p + "/d/e", p + "/d/e/f.bin"})
    EXPECT_EQ(Project(q).project_id, ida) << q;
  EXPECT_TRUE(Project(p + "/d/e").inherit);
  // The volume root and unscoped vfolders keep project 0.
  EXPECT_EQ(Project(mount_).project_id, 0u);
  // A second volume object on the same directory continues the counter.
  auto again = Open(mount_);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->quota().CreateScope(Scope('c'), std::nullopt).ok());
  EXPECT_GT(IdFile(Scope('c')), std::max(ida, idb));
}

TEST_F(XfsVolumeTest, AdoptsScopeWithoutIdFile) {
  auto a = Scope('a');
  auto vf = VF(a, '1');
  std::string p = vol_->VFolderPath(vf);
  fs::create_directories(p + "/sub");
  WriteFile(p + "/sub/f.bin", std::string(5000, 'x'));
  fs::create_symlink("sub/f.bin", p + "/link");
  auto d = vol_->quota().DescribeScope(a);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  uint32_t id = IdFile(a);
  EXPECT_GE(id, XfsVolume::kFirstProjectId);
  for (const std::string& q : {vol_->quota().ScopePath(a), p, p + "/sub", p + "/sub/f.bin"})
    EXPECT_EQ(Project(q).project_id, id) << q;
  if (!vol_->limits_enforced()) {
    EXPECT_EQ(d->used_bytes, 5000u + 9);  // the file and the symlink ("sub/f.bin")
  }
  // A scope made elsewhere is adopted before a vfolder is created in it.
  auto b = Scope('b');
  fs::create_directories(vol_->quota().ScopePath(b) + "/old");
  auto vfb = VF(b, '2');
  ASSERT_TRUE(vol_->CreateVFolder(vfb, 0755, false, std::nullopt).ok());
  EXPECT_EQ(Project(vol_->VFolderPath(vfb)).project_id, IdFile(b));
  EXPECT_EQ(Project(vol_->quota().ScopePath(b) + "/old").project_id, IdFile(b));
  // Adopted once: the id stays.
  ASSERT_TRUE(vol_->quota().DescribeScope(a).ok());
  EXPECT_EQ(IdFile(a), id);
}

TEST_F(XfsVolumeTest, ReflinkCloneSharesExtentsAndTakesDestinationProject) {
  EXPECT_TRUE(vol_->reflink());
  EXPECT_TRUE(vol_->capabilities().count(kCapFastClone));
  auto a = Scope('a'), b = Scope('b');
  auto src = VF(a, '1'), dst = VF(b, '2');
  ASSERT_TRUE(vol_->CreateVFolder(src, 0755, true, std::nullopt).ok());
  ASSERT_TRUE(vol_->CreateVFolder(dst, 0755, true, std::nullopt).ok());
  std::string data = Pattern(2 * kMiB + 123, 1);
  fs::create_directories(vol_->VFolderPath(src) + "/d");
  WriteFile(vol_->VFolderPath(src) + "/d/big.bin", data);
  Status s = vol_->CopyVFolderFrom(*vol_, src, dst, *vol_->GetFreshUsage(src));
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::string copy = vol_->VFolderPath(dst) + "/d/big.bin";
  EXPECT_EQ(ReadFile(copy), data);
  EXPECT_TRUE(AllExtentsShared(copy));
  EXPECT_TRUE(AllExtentsShared(vol_->VFolderPath(src) + "/d/big.bin"));
  EXPECT_EQ(Project(copy).project_id, IdFile(b));
  EXPECT_EQ(Project(vol_->VFolderPath(dst) + "/d").project_id, IdFile(b));
  EXPECT_EQ(Project(vol_->VFolderPath(src) + "/d/big.bin").project_id, IdFile(a));
  // Writing to the copy leaves the source alone.
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f << "changed";
  }
  EXPECT_EQ(ReadFile(vol_->VFolderPath(src) + "/d/big.bin"), data);
  // Detach and delete work across project ids (the trash has none).
  auto trash = vol_->DetachVFolder(dst);
  ASSERT_TRUE(trash.ok()) << trash.status().ToString();
  ASSERT_TRUE(vol_->fsop().DeleteTree(*trash).ok());
}

TEST_F(XfsVolumeTest, LimitsEnforcedOrRefused) {
  auto a = Scope('a');
  HwInfo info = vol_->GetHwInfo();
  if (QuotaKernel()) {
    // A kernel with CONFIG_XFS_QUOTA and a filesystem mounted with prjquota.
    EXPECT_EQ(info.status, "healthy") << info.status_info;
    EXPECT_TRUE(vol_->limits_enforced());
    EXPECT_TRUE(vol_->capabilities().count(kCapQuota));
    ASSERT_TRUE(vol_->quota().CreateScope(a, kMiB).ok());
    EXPECT_EQ(*vol_->quota().DescribeScope(a)->limit_bytes, kMiB);
    auto vf = VF(a, '1');
    ASSERT_TRUE(vol_->CreateVFolder(vf, 0755, false, std::nullopt).ok());
    int fd = ::open((vol_->VFolderPath(vf) + "/f").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    std::string chunk(256 << 10, 'x');
    int err = 0;
    for (int i = 0; i < 8 && !err; ++i)
      if (::write(fd, chunk.data(), chunk.size()) < 0) err = errno;
    if (!err && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    EXPECT_EQ(err, EDQUOT);
    auto d = vol_->quota().DescribeScope(a);
    EXPECT_LE(d->used_bytes, kMiB);
    EXPECT_GT(d->used_bytes, kMiB / 2);
    ASSERT_TRUE(vol_->quota().UpdateScope(a, 4 * kMiB).ok());
    EXPECT_EQ(*vol_->quota().DescribeScope(a)->limit_bytes, 4 * kMiB);
    ASSERT_TRUE(vol_->quota().UnsetQuota(a).ok());
    EXPECT_FALSE(vol_->quota().DescribeScope(a)->limit_bytes.has_value());
    return;
  }
  // This kernel: no XFS quota support. Degraded, with the precise reason.
  EXPECT_EQ(info.status, "degraded");
  EXPECT_NE(info.status_info.find("kernel has no XFS quota support"), std::string::npos)
      << info.status_info;
  EXPECT_NE(info.status_info.find("Function not implemented"), std::string::npos)
      << info.status_info;
  EXPECT_NE(info.status_info.find("limits are not enforced"), std::string::npos)
      << info.status_info;
  EXPECT_EQ(info.metadata["project_quota"], "unavailable");
  EXPECT_EQ(info.metadata["device"], test::LoopFs::Xfs().device());
  EXPECT_FALSE(vol_->capabilities().count(kCapQuota));
  EXPECT_TRUE(vol_->capabilities().count(kCapVFolder));
  // Limits are refused with the reason; nothing is made.
  Status s = vol_->quota().CreateScope(a, kMiB);
  EXPECT_EQ(s.code(), Code::kUnsupported);
  EXPECT_NE(s.message().find("kernel has no XFS quota support"), std::string::npos) << s.ToString();
  EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(a)));
  s = vol_->quota().UpdateScope(a, kMiB);
  EXPECT_EQ(s.code(), Code::kUnsupported);
  EXPECT_NE(s.message().find("cannot set a limit on quota scope"), std::string::npos)
      << s.ToString();
  EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(a)));
  // Scopes without limits work, with usage from a walk.
  auto vf = VF(a, '1');
  ASSERT_TRUE(vol_->CreateVFolder(vf, 0755, true, std::nullopt).ok());
  WriteFile(vol_->VFolderPath(vf) + "/f", std::string(10000, 'x'));
  auto d = vol_->quota().DescribeScope(a);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->used_bytes, 10000u);
  EXPECT_FALSE(d->limit_bytes.has_value());
  EXPECT_EQ(vol_->quota().UpdateScope(a, kMiB).code(), Code::kUnsupported);
  EXPECT_TRUE(vol_->quota().UnsetQuota(a).ok());
}

TEST_F(XfsVolumeTest, InitRefusesOtherFilesystems) {
  std::string dir = "/tmp/sluice-xfs-notxfs-" + std::to_string(::getpid());
  fs::create_directories(dir);
  VolumeConfig cfg;
  cfg.name = "xf";
  cfg.backend = "xfs";
  cfg.path = dir;
  auto v = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{pool_.get()});
  ASSERT_TRUE(v.ok());
  Status s = (*v)->Init();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("not on an XFS filesystem"), std::string::npos) << s.ToString();
  fs::remove_all(dir);
  // ext4 is the same class under another name: it refuses XFS.
  cfg.backend = "ext4";
  cfg.path = mount_;
  auto e = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{pool_.get()});
  ASSERT_TRUE(e.ok());
  EXPECT_NE((*e)->Init().message().find("not on an ext4 filesystem"), std::string::npos);
}

TEST(XfsFs, BlockDeviceComesFromMountinfo) {
  auto& loop = test::LoopFs::Xfs();
  ASSERT_TRUE(loop.ok()) << loop.error();
  auto dev = xfs::BlockDevice(loop.mount());
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(*dev, loop.device());
  auto st = xfs::GetQuotaState(*dev);
  if (!QuotaKernel()) {
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().sys_errno(), ENOSYS) << st.status().ToString();
  }
}

}  // namespace
}  // namespace sluice
