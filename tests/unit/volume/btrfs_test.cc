// The btrfs backend on a loop-mounted btrfs filesystem with qgroups: limits enforced by the kernel
// (EDQUOT) across every vfolder of a scope, fresh usage, snapshot and reflink clones charged to
// the destination and checked against its limit, deletes that outlive qgroup cleanup.
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/thread_pool.h"
#include "support/loop_fs.h"
#include "volume/btrfs/btrfs_fs.h"
#include "volume/btrfs/btrfs_volume.h"
#include "volume/registry.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using btrfs::Qgroup;

constexpr uint64_t kMiB = 1 << 20;

QuotaScopeId Scope(char c) {
  return QuotaScopeId::Parse("user:" + std::string(32, c)).value();
}
VFolderId VF(const QuotaScopeId& qs, char c) {
  return VFolderId::Parse(qs.ToString() + "/" + std::string(32, c)).value();
}

struct WriteResult {
  int err = 0;  // errno of the first failed write; 0 when everything went through
  uint64_t written = 0;
};

// Writes `size` bytes of a pattern seeded by `seed` in 1 MiB writes.
WriteResult WriteData(const std::string& path, uint64_t size, uint32_t seed, bool sync = false) {
  WriteResult r;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return {errno, 0};
  std::string buf(kMiB, '\0');
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>((i * 131 + seed * 7) % 251);
  while (r.written < size) {
    uint64_t chunk = r.written / kMiB;
    std::memcpy(buf.data(), &chunk, sizeof(chunk));
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - r.written));
    ssize_t w = ::write(fd, buf.data(), n);
    if (w < 0) {
      r.err = errno;
      break;
    }
    r.written += static_cast<uint64_t>(w);
  }
  if (r.err == 0 && sync && ::fsync(fd) != 0) r.err = errno;
  if (::close(fd) != 0 && r.err == 0) r.err = errno;
  return r;
}

std::string ReadAll(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether the first extent of the file is shared with another file (a reflink or snapshot).
bool FirstExtentShared(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  alignas(struct fiemap) char buf[sizeof(struct fiemap) + sizeof(struct fiemap_extent)] = {};
  auto* fm = reinterpret_cast<struct fiemap*>(buf);
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = 1;
  int rc = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  ::close(fd);
  return rc == 0 && fm->fm_mapped_extents == 1 &&
         (fm->fm_extents[0].fe_flags & FIEMAP_EXTENT_SHARED);
}

class BtrfsVolumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& loop = test::LoopFs::Btrfs();
    ASSERT_TRUE(loop.ok()) << loop.error();
    base_ = loop.MakeTempDir("btrfs-test");
    ASSERT_FALSE(base_.empty());
    mount_ = base_ + "/vol";
    fs::create_directory(mount_);
    pool_ = std::make_unique<ThreadPool>("scan", 4);
    vol_ = Open(mount_);
    ASSERT_NE(vol_, nullptr);
    mfd_ = ::open(mount_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(mfd_, 0);
    auto fsid = btrfs::FilesystemUuid(mfd_);
    ASSERT_TRUE(fsid.ok()) << fsid.status().ToString();
    sysfs_ = btrfs::QgroupSysfs(*fsid);
  }
  void TearDown() override {
    if (mfd_ >= 0) ::close(mfd_);
    vol_.reset();
    pool_.reset();
    if (!base_.empty()) fs::remove_all(base_);
  }

  std::unique_ptr<Volume> Open(const std::string& path) {
    VolumeConfig c;
    c.name = "bt";
    c.backend = "btrfs";
    c.path = path;
    auto v = VolumeRegistry::Builtin().Create(c, VolumeDeps{pool_.get()});
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    if (!v.ok()) return nullptr;
    Status init = (*v)->Init();
    EXPECT_TRUE(init.ok()) << init.ToString();
    if (!init.ok()) return nullptr;
    return std::move(v).value();
  }

  void MakeVFolder(const VFolderId& vf, std::optional<uint64_t> scope_limit = std::nullopt) {
    Status s = vol_->CreateVFolder(vf, 0755, true, scope_limit);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::string P(const VFolderId& vf) { return vol_->VFolderPath(vf); }

  uint64_t ScopeQgroup(const QuotaScopeId& qs) {
    std::string text = ReadAll(vol_->quota().ScopePath(qs) + "/.sluice-qgroup");
    auto q = btrfs::ParseQgroupName(text.substr(0, text.find('\n')));
    EXPECT_TRUE(q.ok()) << "'" << text << "'";
    return q.ok() ? *q : 0;
  }
  uint64_t SubvolId(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    auto id = btrfs::SubvolumeId(fd);
    ::close(fd);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : 0;
  }
  btrfs::SubvolumeInfo Info(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    auto info = btrfs::GetSubvolumeInfo(fd);
    ::close(fd);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? *info : btrfs::SubvolumeInfo{};
  }
  // Committed counters of a qgroup.
  btrfs::QgroupCounters Counters(uint64_t q) {
    EXPECT_TRUE(btrfs::CommitTransaction(mfd_).ok());
    auto c = sysfs_.Read(q);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : btrfs::QgroupCounters{};
  }
  // A vfolder holding `files` files of `each` bytes (plus a directory and a symlink), written
  // back to disk.
  void Populate(const VFolderId& vf, int files, uint64_t each) {
    fs::create_directories(P(vf) + "/sub");
    for (int i = 0; i < files; ++i) {
      auto r = WriteData(P(vf) + "/sub/f" + std::to_string(i), each, i, true);
      ASSERT_EQ(r.err, 0) << std::strerror(r.err);
    }
    fs::create_symlink("sub/f0", P(vf) + "/link");
  }
  void ExpectSameTree(const VFolderId& a, const VFolderId& b, int files) {
    for (int i = 0; i < files; ++i) {
      std::string rel = "/sub/f" + std::to_string(i);
      ASSERT_TRUE(ReadAll(P(a) + rel) == ReadAll(P(b) + rel)) << rel << " differs";
    }
    EXPECT_EQ(fs::read_symlink(P(b) + "/link"), "sub/f0");
  }

  std::string base_, mount_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Volume> vol_;
  int mfd_ = -1;
  btrfs::QgroupSysfs sysfs_;
};

TEST_F(BtrfsVolumeTest, ScopesAndVFoldersAreSubvolumesUnderOneLevel1Qgroup) {
  auto caps = vol_->capabilities();
  for (const char* c : {kCapVFolder, kCapQuota, kCapMetric, kCapFastSize, kCapFastClone})
    EXPECT_TRUE(caps.count(c)) << c;
  auto qs = Scope('a');
  auto vf1 = VF(qs, '1'), vf2 = VF(qs, '2');
  MakeVFolder(vf1, 4 * kMiB);
  MakeVFolder(vf2);
  struct stat sb;
  ASSERT_EQ(::stat(vol_->quota().ScopePath(qs).c_str(), &sb), 0);
  EXPECT_TRUE(btrfs::IsSubvolumeRoot(sb));
  ASSERT_EQ(::stat(P(vf1).c_str(), &sb), 0);
  EXPECT_TRUE(btrfs::IsSubvolumeRoot(sb));
  EXPECT_EQ(sb.st_mode & 07777, 0755u);

  uint64_t q = ScopeQgroup(qs);
  EXPECT_EQ(btrfs::QgroupLevel(q), 1);
  auto rel = btrfs::GetQgroupRelations(mfd_, q);
  ASSERT_TRUE(rel.ok()) << rel.status().ToString();
  std::vector<uint64_t> members = rel->children;
  std::sort(members.begin(), members.end());
  // The vfolders; not the scope subvolume itself, which holds only Sluice's hash directories.
  std::vector<uint64_t> want = {Qgroup(0, SubvolId(P(vf1))), Qgroup(0, SubvolId(P(vf2)))};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(members, want);
  // The limit is read back from the kernel.
  auto c = sysfs_.Read(q);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_referenced, 4 * kMiB);
  EXPECT_EQ(vol_->quota().DescribeScope(qs)->limit_bytes, 4 * kMiB);
  EXPECT_FALSE(sysfs_.Inconsistent());
}

TEST_F(BtrfsVolumeTest, WritesPastTheLimitFailWithEdquot) {
  auto qs = Scope('b');
  auto vf = VF(qs, '1');
  MakeVFolder(vf, 8 * kMiB);
  auto r = WriteData(P(vf) + "/big", 32 * kMiB, 1);
  EXPECT_EQ(r.err, EDQUOT) << std::strerror(r.err);
  EXPECT_EQ(r.err, 122);
  EXPECT_LE(r.written, 8 * kMiB);
  // The status the upload paths build from that errno is a quota error (HTTP 413).
  EXPECT_EQ(Status::FromErrno(r.err, "write").code(), Code::kQuotaExceeded);
  auto d = vol_->quota().DescribeScope(qs);
  ASSERT_TRUE(d.ok());
  EXPECT_LE(d->used_bytes, 8 * kMiB);
  // A raised limit lets writes through again.
  ASSERT_TRUE(vol_->quota().UpdateScope(qs, 64 * kMiB).ok());
  EXPECT_EQ(WriteData(P(vf) + "/big", 32 * kMiB, 1).err, 0);
  ASSERT_TRUE(vol_->quota().UnsetQuota(qs).ok());
  EXPECT_FALSE(vol_->quota().DescribeScope(qs)->limit_bytes.has_value());
}

TEST_F(BtrfsVolumeTest, LimitCoversEveryVFolderOfTheScope) {
  auto qs = Scope('c');
  auto a = VF(qs, '1'), b = VF(qs, '2');
  MakeVFolder(a, 12 * kMiB);
  MakeVFolder(b);
  auto ra = WriteData(P(a) + "/data", 8 * kMiB, 1, true);
  ASSERT_EQ(ra.err, 0) << std::strerror(ra.err);
  // Each vfolder alone is under the limit; together they are not.
  auto rb = WriteData(P(b) + "/data", 8 * kMiB, 2, true);
  EXPECT_EQ(rb.err, EDQUOT) << std::strerror(rb.err);
  EXPECT_LT(rb.written, 5 * kMiB);
  // A vfolder created after the limit was set is covered as well.
  auto c = VF(qs, '3');
  MakeVFolder(c);
  EXPECT_EQ(WriteData(P(c) + "/data", 8 * kMiB, 3).err, EDQUOT);
}

TEST_F(BtrfsVolumeTest, UsageIsFreshAndMatchesWhatWasWritten) {
  auto qs = Scope('d');
  auto vf = VF(qs, '1');
  MakeVFolder(vf);
  // Not synced: the committed qgroup counters do not have it yet.
  ASSERT_EQ(WriteData(P(vf) + "/a.bin", 8 * kMiB, 1).err, 0);
  auto u = vol_->GetUsage(vf);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_GE(u->used_bytes, 8 * kMiB);
  EXPECT_LE(u->used_bytes, 8 * kMiB + 64 * 1024);
  EXPECT_EQ(u->file_count, 1u);
  auto d = vol_->quota().DescribeScope(qs);
  ASSERT_TRUE(d.ok());
  EXPECT_GE(d->used_bytes, 8 * kMiB);
  EXPECT_LE(d->used_bytes, 8 * kMiB + 96 * 1024);

  fs::create_directories(P(vf) + "/x/y");
  ASSERT_EQ(WriteData(P(vf) + "/x/y/b.bin", 2 * kMiB, 2, true).err, 0);
  u = vol_->GetUsage(vf);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->file_count, 4u);
  EXPECT_GE(u->used_bytes, 10 * kMiB);
  EXPECT_LE(u->used_bytes, 10 * kMiB + 64 * 1024);

  // A delete shows at once (the counters alone would lag until the next commit).
  ::sync();
  fs::remove(P(vf) + "/a.bin");
  auto used = vol_->GetUsedBytes(vf);
  ASSERT_TRUE(used.ok());
  EXPECT_GE(*used, 2 * kMiB);
  EXPECT_LE(*used, 2 * kMiB + 64 * 1024);
  EXPECT_LE(vol_->quota().DescribeScope(qs)->used_bytes, 2 * kMiB + 96 * 1024);
}

TEST_F(BtrfsVolumeTest, CloneWithinAScopeIsASnapshot) {
  auto qs = Scope('e');
  auto src = VF(qs, '1'), dst = VF(qs, '2');
  MakeVFolder(src, 256 * kMiB);
  ::chmod(P(src).c_str(), 0750);
  Populate(src, 16, 2 * kMiB);
  MakeVFolder(dst);
  auto t0 = std::chrono::steady_clock::now();
  Status s = vol_->CopyVFolderFrom(*vol_, src, dst, *vol_->GetFreshUsage(src));
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::printf("snapshot clone of 32 MiB: %.1f ms\n",
              std::chrono::duration<double, std::milli>(took).count());
  ExpectSameTree(src, dst, 16);
  EXPECT_EQ(Info(P(dst)).parent_uuid, Info(P(src)).uuid);
  struct stat sb;
  ASSERT_EQ(::stat(P(dst).c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0750u);
  EXPECT_TRUE(FirstExtentShared(P(dst) + "/sub/f3"));
  // The clone references all the data and owns almost none of it: nothing was copied.
  auto c = Counters(Qgroup(0, SubvolId(P(dst))));
  EXPECT_GE(c.referenced, 32 * kMiB);
  EXPECT_LT(c.exclusive, 1 * kMiB);
  // It sits in the scope's qgroup, whose numbers stay exact (shared data counts once).
  auto rel = btrfs::GetQgroupRelations(mfd_, Qgroup(0, SubvolId(P(dst))));
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ(rel->parents, std::vector<uint64_t>{ScopeQgroup(qs)});
  EXPECT_FALSE(sysfs_.Inconsistent());
  auto used = vol_->GetUsedBytes(dst);
  ASSERT_TRUE(used.ok());
  EXPECT_GE(*used, 32 * kMiB);
  // No placeholder or temporary subvolume is left beside it.
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(fs::path(P(dst)).parent_path()))
    names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{fs::path(P(dst)).filename()});
}

TEST_F(BtrfsVolumeTest, CloneAcrossScopesIsAReflinkCopyChargedToTheDestination) {
  auto qa = Scope('f'), qb = Scope('9');
  auto src = VF(qa, '1'), dst = VF(qb, '2');
  MakeVFolder(src);
  Populate(src, 16, 2 * kMiB);
  MakeVFolder(dst, 128 * kMiB);
  Status s = vol_->CopyVFolderFrom(*vol_, src, dst, *vol_->GetFreshUsage(src));
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectSameTree(src, dst, 16);
  EXPECT_TRUE(FirstExtentShared(P(dst) + "/sub/f5"));
  EXPECT_EQ(Info(P(dst)).parent_uuid, "");  // a subvolume of its own, filled by reflinks
  auto c = Counters(Qgroup(0, SubvolId(P(dst))));
  EXPECT_GE(c.referenced, 32 * kMiB);
  EXPECT_LT(c.exclusive, 1 * kMiB);
  // Counts against the destination scope, and the accounting stays exact.
  auto d = vol_->quota().DescribeScope(qb);
  ASSERT_TRUE(d.ok());
  EXPECT_GE(d->used_bytes, 32 * kMiB);
  EXPECT_LE(d->used_bytes, 33 * kMiB);
  EXPECT_FALSE(sysfs_.Inconsistent());
}

TEST_F(BtrfsVolumeTest, CloneIntoAScopeWithTooSmallALimitIsRefusedBeforeCopying) {
  auto qa = Scope('1'), qb = Scope('2');
  auto src = VF(qa, '1'), dst = VF(qb, '2');
  MakeVFolder(src);
  Populate(src, 4, 2 * kMiB);
  MakeVFolder(dst, 4 * kMiB);
  Status s = vol_->CopyVFolderFrom(*vol_, src, dst, *vol_->GetFreshUsage(src));
  EXPECT_EQ(s.code(), Code::kQuotaExceeded) << s.ToString();
  EXPECT_NE(s.message().find("quota scope " + qb.ToString()), std::string::npos) << s.message();
  EXPECT_TRUE(fs::is_empty(P(dst)));
  EXPECT_LT(vol_->quota().DescribeScope(qb)->used_bytes, 1 * kMiB);
  // Within the source's own scope too: a snapshot would pass any limit unchecked.
  auto same = VF(qa, '3');
  MakeVFolder(same);
  ASSERT_TRUE(vol_->quota().UpdateScope(qa, 10 * kMiB).ok());
  s = vol_->CopyVFolderFrom(*vol_, src, same, *vol_->GetFreshUsage(src));
  EXPECT_EQ(s.code(), Code::kQuotaExceeded) << s.ToString();
  EXPECT_TRUE(fs::is_empty(P(same)));
}

TEST_F(BtrfsVolumeTest, DeleteScopeWhileQgroupCleanupIsPending) {
  auto qs = Scope('7');
  auto vf = VF(qs, '1');
  MakeVFolder(vf, 64 * kMiB);
  ASSERT_EQ(WriteData(P(vf) + "/data", 8 * kMiB, 1, true).err, 0);
  uint64_t q = ScopeQgroup(qs);
  uint64_t scope_id = SubvolId(vol_->quota().ScopePath(qs));
  uint64_t vf_id = SubvolId(P(vf));

  auto trash = vol_->DetachVFolder(vf);
  ASSERT_TRUE(trash.ok());
  ASSERT_TRUE(vol_->fsop().DeleteTree(*trash).ok());
  Status del = vol_->quota().DeleteScope(qs);
  ASSERT_TRUE(del.ok()) << del.ToString();
  EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(qs)));
  EXPECT_EQ(vol_->quota().DescribeScope(qs).status().code(), Code::kNotFound);
  // The kernel has not dropped the subvolumes yet: the level-1 qgroup still has members and
  // cannot be destroyed; it waits in the stale list.
  EXPECT_TRUE(sysfs_.Exists(q));
  EXPECT_EQ(btrfs::DestroyQgroup(mfd_, q).code(), Code::kConflict);
  EXPECT_TRUE(fs::exists(mount_ + "/.sluice-stale-qgroups/" + std::to_string(1) + "_" +
                         std::to_string(btrfs::QgroupSubid(q))));

  // The same scope can be made again at once, with a qgroup of its own.
  ASSERT_TRUE(vol_->quota().CreateScope(qs, 2 * kMiB).ok());
  EXPECT_NE(ScopeQgroup(qs), q);
  auto vf2 = VF(qs, '2');
  MakeVFolder(vf2);
  EXPECT_EQ(WriteData(P(vf2) + "/data", 4 * kMiB, 2).err, EDQUOT);

  // Once the cleaner is done, the next reap (here: a restart) destroys the old qgroups.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    ASSERT_EQ(::ioctl(mfd_, BTRFS_IOC_SYNC), 0);  // commits and wakes the cleaner
    auto a = btrfs::SubvolumeExists(mfd_, scope_id), b = btrfs::SubvolumeExists(mfd_, vf_id);
    ASSERT_TRUE(a.ok() && b.ok());
    if (!*a && !*b) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "subvolumes never cleaned up";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  vol_ = Open(mount_);
  ASSERT_NE(vol_, nullptr);
  EXPECT_FALSE(sysfs_.Exists(q));
  EXPECT_FALSE(sysfs_.Exists(Qgroup(0, scope_id)));
  EXPECT_FALSE(sysfs_.Exists(Qgroup(0, vf_id)));
  EXPECT_FALSE(fs::exists(mount_ + "/.sluice-stale-qgroups"));
  EXPECT_FALSE(sysfs_.Inconsistent());
}

// The stale-qgroup reaper runs right when the cleaner has dropped a subvolume, before the commit
// that accounts its last blocks: destroying the qgroup then would make the kernel mark all
// accounting inconsistent (and stop enforcing limits correctly).
TEST_F(BtrfsVolumeTest, ReapingRightAfterCleanupKeepsAccountingConsistent) {
  auto qs = Scope('5');
  // Reaps run all the time (every DeleteTree reaps) while the cleaner drops the subvolumes.
  std::atomic<bool> stop{false};
  std::thread reaper([&] {
    while (!stop) (void)vol_->fsop().DeleteTree(base_ + "/no-such-entry");
  });
  for (char c : {'1', '2', '3', '4', '5', '6'}) {
    auto vf = VF(qs, c);
    MakeVFolder(vf);
    ASSERT_EQ(WriteData(P(vf) + "/data", 256 * 1024, 1, true).err, 0);
    uint64_t id = SubvolId(P(vf));
    auto trash = vol_->DetachVFolder(vf);
    ASSERT_TRUE(trash.ok());
    ASSERT_TRUE(vol_->fsop().DeleteTree(*trash).ok());
    ASSERT_EQ(::ioctl(mfd_, BTRFS_IOC_SYNC), 0);  // commits and wakes the cleaner
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      auto alive = btrfs::SubvolumeExists(mfd_, id);
      ASSERT_TRUE(alive.ok());
      if (!*alive) break;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "subvolume never cleaned up";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  stop = true;
  reaper.join();
  ASSERT_TRUE(btrfs::CommitTransaction(mfd_).ok());
  EXPECT_FALSE(sysfs_.Inconsistent());
  // Limits still hold.
  auto vf = VF(qs, '9');
  MakeVFolder(vf);
  ASSERT_TRUE(vol_->quota().UpdateScope(qs, 2 * kMiB).ok());
  EXPECT_EQ(WriteData(P(vf) + "/data", 8 * kMiB, 2).err, EDQUOT);
}

TEST_F(BtrfsVolumeTest, DeleteTreeRemovesNestedSubvolumes) {
  auto qs = Scope('8');
  auto vf = VF(qs, '1');
  MakeVFolder(vf);
  // A user may create subvolumes inside a vfolder.
  int vfd = ::open(P(vf).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(vfd, 0);
  ASSERT_TRUE(btrfs::CreateSubvolume(vfd, "inner", std::nullopt).ok());
  ::close(vfd);
  fs::create_directories(P(vf) + "/inner/d");
  ASSERT_EQ(WriteData(P(vf) + "/inner/d/f", kMiB, 1).err, 0);
  ASSERT_EQ(WriteData(P(vf) + "/top", kMiB, 2).err, 0);
  auto trash = vol_->DetachVFolder(vf);
  ASSERT_TRUE(trash.ok());
  Status s = vol_->fsop().DeleteTree(*trash);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(fs::exists(*trash));
  // A plain directory holding a subvolume.
  fs::create_directories(base_ + "/plain/d");
  int pfd = ::open((base_ + "/plain/d").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_TRUE(btrfs::CreateSubvolume(pfd, "sub", std::nullopt).ok());
  ::close(pfd);
  ASSERT_EQ(WriteData(base_ + "/plain/d/sub/f", kMiB, 3).err, 0);
  s = vol_->fsop().DeleteTree(base_ + "/plain");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(fs::exists(base_ + "/plain"));
  EXPECT_TRUE(vol_->quota().DeleteScope(qs).ok());
}

TEST_F(BtrfsVolumeTest, AdoptsAScopeSubvolumeMadeWithoutALevel1Qgroup) {
  // Backend.AI's own btrfs backend: a scope subvolume with the limit on its own qgroup.
  auto qs = Scope('6');
  ASSERT_TRUE(btrfs::CreateSubvolume(mfd_, qs.hex, std::nullopt).ok());
  uint64_t id = SubvolId(vol_->quota().ScopePath(qs));
  ASSERT_TRUE(btrfs::SetQgroupLimit(mfd_, Qgroup(0, id), 4 * kMiB).ok());
  auto d = vol_->quota().DescribeScope(qs);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->limit_bytes, 4 * kMiB);
  EXPECT_EQ(btrfs::QgroupLevel(ScopeQgroup(qs)), 1);
  auto vf = VF(qs, '1');
  MakeVFolder(vf);
  EXPECT_EQ(WriteData(P(vf) + "/data", 8 * kMiB, 1).err, EDQUOT);
  EXPECT_FALSE(sysfs_.Inconsistent());
}

// A vfolder that is a plain directory in its scope's subvolume (made elsewhere) cannot be
// renamed out of it into <mount>/.sluice-trash (EXDEV): it waits in the scope's own trash,
// which EmptyTrash empties, and the scope then deletes. Before, every delete of it failed.
TEST_F(BtrfsVolumeTest, APlainDirectoryVFolderInAScopeDeletes) {
  auto qs = Scope('7');
  ASSERT_TRUE(vol_->quota().CreateScope(qs, std::nullopt).ok());
  auto vf = VF(qs, '2');
  fs::create_directories(P(vf) + "/sub");
  std::ofstream(P(vf) + "/sub/f") << "data";
  ASSERT_TRUE(vol_->CheckVFolder(vf).ok());
  auto trash = vol_->DetachVFolder(vf);
  ASSERT_TRUE(trash.ok()) << trash.status().ToString();
  EXPECT_EQ(vol_->CheckVFolder(vf).code(), Code::kNotFound);
  EXPECT_TRUE(fs::exists(*trash + "/sub/f"));
  ASSERT_TRUE(vol_->EmptyTrash().ok());
  EXPECT_FALSE(fs::exists(*trash));
  Status del = vol_->quota().DeleteScope(qs);
  EXPECT_TRUE(del.ok()) << del.ToString();
  EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(qs)));
}

TEST_F(BtrfsVolumeTest, RefusesAPathNotOnBtrfs) {
  char tmpl[] = "/tmp/sluice-notbtrfs-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  VolumeConfig c;
  c.name = "bt";
  c.backend = "btrfs";
  c.path = tmpl;
  auto v = VolumeRegistry::Builtin().Create(c, VolumeDeps{pool_.get()});
  ASSERT_TRUE(v.ok());
  Status s = (*v)->Init();
  fs::remove_all(tmpl);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("not on a btrfs filesystem"), std::string::npos) << s.message();
  c.options = {{"x", 1}};
  EXPECT_EQ(VolumeRegistry::Builtin().Create(c, VolumeDeps{}).status().code(),
            Code::kInvalidArgument);
}

TEST_F(BtrfsVolumeTest, HwInfoNamesTheQgroupState) {
  HwInfo info = vol_->GetHwInfo();
  EXPECT_EQ(info.status, "healthy") << info.status_info;
  EXPECT_EQ(info.metadata["qgroups"], "qgroup");
  EXPECT_EQ(info.metadata["backend"], "btrfs");
}

}  // namespace
}  // namespace sluice
