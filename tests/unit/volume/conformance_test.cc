// Behaviour every backend must show through Volume / QuotaModel / FSOpModel. Each backend that
// can run on this machine is one instance of the parameterised suite.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/thread_pool.h"
#include "loop_fs.h"
#include "volume/registry.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

struct Backend {
  std::string name;
  // Prepares a fresh volume directory and returns its config.
  std::function<VolumeConfig(const std::string& dir)> make_config;
  // Where the test's scratch directory goes, when /tmp will not do (a filesystem the backend
  // needs); returns "" and sets `error` when that filesystem is not available.
  std::function<std::string(std::string* error)> scratch_root;
  // Backends that report allocated bytes (btrfs qgroups: whole blocks plus each subvolume's own
  // metadata) may stray this far from the bytes written; 0: usage is the exact apparent size.
  uint64_t usage_slack = 0;
  // Whether the backend can set scope limits on this machine. xfs without kernel quota support
  // cannot: it must refuse every limit with kUnsupported (and still run scopes without limits).
  bool limits = true;
  // How long usage may lag writes made on the filesystem (CephFS recursive statistics reach
  // the MDS seconds later); 0: usage is current at once.
  std::chrono::seconds usage_lag{0};
  // Whether a path just used can be opened from the dentry cache alone (RESOLVE_CACHED).
  bool cached_lookups = true;
};

// Names the backend in test output instead of dumping the struct's bytes.
void PrintTo(const Backend& b, std::ostream* os) {
  *os << b.name;
}

std::string ReadFile(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Snapshot(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

class Conformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    std::string root = "/tmp", error;
    if (GetParam().scratch_root) root = GetParam().scratch_root(&error);
    ASSERT_FALSE(root.empty()) << GetParam().name << " test filesystem: " << error;
    std::string tmpl = root + "/sluice-conf-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    base_ = tmpl;
    mount_ = base_ + "/vol";
    fs::create_directories(mount_);
    pool_ = std::make_unique<ThreadPool>("scan", 4);
    VolumeConfig cfg = GetParam().make_config(mount_);
    auto v = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{pool_.get()});
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    vol_ = std::move(v).value();
    Status init = vol_->Init();
    ASSERT_TRUE(init.ok()) << init.ToString();
    qs_ = QuotaScopeId::Parse("user:11111111111111111111111111111111").value();
    vf_ = VFolderId::Parse(
              "user:11111111111111111111111111111111/"
              "abcdef0123456789abcdef0123456789")
              .value();
  }
  void TearDown() override {
    vol_.reset();
    pool_.reset();
    if (!base_.empty()) fs::remove_all(base_);
  }
  void MakeVFolder() { ASSERT_TRUE(vol_->CreateVFolder(vf_, 0755, true, std::nullopt).ok()); }
  std::string VfPath() { return vol_->VFolderPath(vf_); }
  // Polls `read` until it is within slack of `written` or the backend's usage lag has passed.
  uint64_t Settled(const std::function<uint64_t()>& read, uint64_t written) {
    auto end = std::chrono::steady_clock::now() + GetParam().usage_lag;
    uint64_t got = read();
    uint64_t slack = GetParam().usage_slack;
    while ((got + slack < written || got > written + slack) &&
           std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      got = read();
    }
    return got;
  }
  void ExpectUsage(uint64_t got, uint64_t written) {
    uint64_t slack = GetParam().usage_slack;
    EXPECT_LE(got, written + slack) << "written: " << written;
    EXPECT_GE(got + slack, written) << "written: " << written;
  }

  std::string base_, mount_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Volume> vol_;
  QuotaScopeId qs_;
  VFolderId vf_;
};

TEST_P(Conformance, NewVolumeUsesLayoutV3) {
  EXPECT_EQ(vol_->layout_version(), 3);
  EXPECT_EQ(ReadFile(mount_ + "/version.txt"), "3\n");
  EXPECT_TRUE(vol_->capabilities().count(kCapVFolder));
}

TEST_P(Conformance, ExistingVolumeWithoutVersionIsV2) {
  fs::create_directories(base_ + "/old/ab/cd/ef");
  VolumeConfig cfg = GetParam().make_config(base_ + "/old");
  auto v = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{pool_.get()});
  ASSERT_TRUE(v.ok());
  Status init = (*v)->Init();
  ASSERT_TRUE(init.ok()) << init.ToString();
  EXPECT_EQ((*v)->layout_version(), 2);
  EXPECT_FALSE(fs::exists(base_ + "/old/version.txt"));
  auto legacy = VFolderId::Parse("abcdef0123456789abcdef0123456789").value();
  EXPECT_EQ((*v)->VFolderPath(legacy), base_ + "/old/ab/cd/ef0123456789abcdef0123456789");
}

TEST_P(Conformance, QuotaScopeLifecycle) {
  auto& q = vol_->quota();
  EXPECT_EQ(q.DescribeScope(qs_).status().code(), Code::kNotFound);
  if (!GetParam().limits) {
    // Refused before anything is made; a scope without a limit works.
    EXPECT_EQ(q.CreateScope(qs_, 1 << 20).code(), Code::kUnsupported);
    EXPECT_FALSE(fs::exists(q.ScopePath(qs_)));
    ASSERT_TRUE(q.CreateScope(qs_, std::nullopt).ok());
  } else {
    ASSERT_TRUE(q.CreateScope(qs_, 1 << 20).ok());
  }
  EXPECT_EQ(q.CreateScope(qs_, std::nullopt).code(), Code::kAlreadyExists);
  auto d = q.DescribeScope(qs_);
  ASSERT_TRUE(d.ok());
  ExpectUsage(d->used_bytes, 0);
  if (GetParam().limits) {
    ASSERT_TRUE(d->limit_bytes.has_value());
    EXPECT_EQ(*d->limit_bytes, 1u << 20);
    ASSERT_TRUE(q.UpdateScope(qs_, 2 << 20).ok());
    EXPECT_EQ(*q.DescribeScope(qs_)->limit_bytes, 2u << 20);
  } else {
    EXPECT_FALSE(d->limit_bytes.has_value());
    EXPECT_EQ(q.UpdateScope(qs_, 2 << 20).code(), Code::kUnsupported);
    EXPECT_FALSE(q.DescribeScope(qs_)->limit_bytes.has_value());
  }
  ASSERT_TRUE(q.UnsetQuota(qs_).ok());
  EXPECT_FALSE(q.DescribeScope(qs_)->limit_bytes.has_value());
  EXPECT_TRUE(fs::is_directory(q.ScopePath(qs_)));
  ASSERT_TRUE(q.DeleteScope(qs_).ok());
  EXPECT_FALSE(fs::exists(q.ScopePath(qs_)));
  EXPECT_EQ(q.DeleteScope(qs_).code(), Code::kNotFound);
  EXPECT_EQ(q.UnsetQuota(qs_).code(), Code::kNotFound);
}

TEST_P(Conformance, UpdateCreatesMissingScope) {
  if (!GetParam().limits) {
    EXPECT_EQ(vol_->quota().UpdateScope(qs_, 4096).code(), Code::kUnsupported);
    EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(qs_)));
    return;
  }
  ASSERT_TRUE(vol_->quota().UpdateScope(qs_, 4096).ok());
  EXPECT_EQ(*vol_->quota().DescribeScope(qs_)->limit_bytes, 4096u);
}

TEST_P(Conformance, ScopeWithVFoldersCannotBeDeleted) {
  MakeVFolder();
  EXPECT_EQ(vol_->quota().DeleteScope(qs_).code(), Code::kNotEmpty);
  auto trash = vol_->DetachVFolder(vf_);
  ASSERT_TRUE(trash.ok());
  ASSERT_TRUE(vol_->fsop().DeleteTree(*trash).ok());
  EXPECT_TRUE(vol_->quota().DeleteScope(qs_).ok());
}

TEST_P(Conformance, VFolderLayoutAndMode) {
  if (!GetParam().limits) {
    // An initial limit that cannot be set fails the create and leaves nothing behind.
    EXPECT_EQ(vol_->CreateVFolder(vf_, 0750, true, 12800).code(), Code::kUnsupported);
    EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(qs_)));
  }
  Status created = vol_->CreateVFolder(
      vf_, 0750, true, GetParam().limits ? std::optional<uint64_t>(12800) : std::nullopt);
  ASSERT_TRUE(created.ok()) << created.ToString();
  std::string expect =
      mount_ + "/11111111111111111111111111111111/ab/cd/ef0123456789abcdef0123456789";
  EXPECT_EQ(VfPath(), expect);
  struct stat sb;
  ASSERT_EQ(::stat(expect.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0750u);
  if (GetParam().limits) {
    EXPECT_EQ(*vol_->quota().DescribeScope(qs_)->limit_bytes, 12800u);
  }
  EXPECT_EQ(vol_->CreateVFolder(vf_, 0755, true, std::nullopt).code(), Code::kAlreadyExists);
}

TEST_P(Conformance, MissingScopeWithoutAutoCreation) {
  EXPECT_EQ(vol_->CreateVFolder(vf_, 0755, false, std::nullopt).code(), Code::kNotFound);
  EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(qs_)));
}

TEST_P(Conformance, UsageCountsFilesAndBytes) {
  MakeVFolder();
  fs::create_directories(VfPath() + "/d1/d2");
  std::ofstream(VfPath() + "/a.bin") << std::string(1000, 'a');
  std::ofstream(VfPath() + "/d1/b.bin") << std::string(2000, 'b');
  std::ofstream(VfPath() + "/d1/d2/c.bin") << std::string(3000, 'c');
  // Written behind the volume's back: a maintained figure (vfs) sees it once re-measured.
  auto fresh = vol_->GetFreshUsage(vf_);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ExpectUsage(Settled([&] { return vol_->GetFreshUsage(vf_)->used_bytes; }, 6000), 6000);
  auto u = vol_->GetUsage(vf_);
  ASSERT_TRUE(u.ok());
  ExpectUsage(u->used_bytes, 6000);
  EXPECT_EQ(Settled([&] { return vol_->GetUsage(vf_)->file_count; }, 5), 5u);  // 3 files, 2 dirs
  ExpectUsage(*vol_->GetUsedBytes(vf_), 6000);
  ExpectUsage(Settled([&] { return vol_->quota().DescribeScope(qs_)->used_bytes; }, 6000), 6000);
  auto missing = VFolderId::Parse(
                     "user:11111111111111111111111111111111/"
                     "00000000000000000000000000000000")
                     .value();
  EXPECT_EQ(vol_->GetUsage(missing).status().code(), Code::kNotFound);
}

TEST_P(Conformance, FileOperations) {
  MakeVFolder();
  ASSERT_TRUE(vol_->Mkdir(vf_, "x/y/z", true, false).ok());
  EXPECT_EQ(vol_->Mkdir(vf_, "x/y/z", true, false).code(), Code::kAlreadyExists);
  EXPECT_TRUE(vol_->Mkdir(vf_, "x/y/z", true, true).ok());
  EXPECT_EQ(vol_->Mkdir(vf_, "p/q", false, false).code(), Code::kNotFound);
  std::ofstream(VfPath() + "/x/f.txt") << "data";
  auto list = vol_->ListDir(vf_, "x", 0);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  ASSERT_TRUE(vol_->Rename(vf_, "x/f.txt", "g.txt").ok());
  EXPECT_TRUE(fs::exists(VfPath() + "/x/g.txt"));
  EXPECT_EQ(vol_->Rename(vf_, "x/g.txt", "../g.txt").code(), Code::kInvalidPath);
  ASSERT_TRUE(vol_->Move(vf_, "x/g.txt", "x/y").ok());  // into an existing directory
  EXPECT_TRUE(fs::exists(VfPath() + "/x/y/g.txt"));
  ASSERT_TRUE(vol_->Move(vf_, "x/y/g.txt", "h.txt").ok());
  auto f = vol_->OpenReader(vf_, "h.txt");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->size(), 4u);
  EXPECT_EQ(vol_->OpenReader(vf_, "x").status().code(), Code::kInvalidArgument);
  // A FIFO is refused at once instead of blocking the reader until a writer appears.
  ASSERT_EQ(::mkfifo((VfPath() + "/fifo").c_str(), 0644), 0);
  EXPECT_EQ(vol_->OpenReader(vf_, "fifo").status().code(), Code::kInvalidArgument);
  ASSERT_EQ(::unlink((VfPath() + "/fifo").c_str()), 0);
  EXPECT_EQ(vol_->DeleteFiles(vf_, {"x"}, false).code(), Code::kNotEmpty);
  EXPECT_TRUE(fs::exists(VfPath() + "/x/y/z"));
  ASSERT_TRUE(vol_->DeleteFiles(vf_, {"x", "h.txt"}, true).ok());
  EXPECT_TRUE(fs::is_empty(VfPath()));
}

TEST_P(Conformance, HostilePathsChangeNothing) {
  MakeVFolder();
  std::ofstream(base_ + "/outside.txt") << "keep";
  std::ofstream(VfPath() + "/in.txt") << "in";
  fs::create_symlink(base_, VfPath() + "/out");
  auto before = Snapshot(base_);
  EXPECT_EQ(vol_->Mkdir(vf_, "../evil", true, false).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->Mkdir(vf_, "out/evil", true, false).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->OpenReader(vf_, "out/outside.txt").status().code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->OpenReader(vf_, "/etc/passwd").status().code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->ListDir(vf_, "out", 0).status().code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->DeleteFiles(vf_, {"in.txt", "out/outside.txt"}, true).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->Move(vf_, "in.txt", "out/moved.txt").code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->Rename(vf_, "in.txt", std::string("a\0b", 3)).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->MountPath(vf_, "out/x").status().code(), Code::kInvalidPath);
  EXPECT_EQ(Snapshot(base_), before);
  // Deleting the symlink itself removes the link, never its target.
  ASSERT_TRUE(vol_->DeleteFiles(vf_, {"out"}, true).ok());
  EXPECT_EQ(ReadFile(base_ + "/outside.txt"), "keep");
}

TEST_P(Conformance, CopyTreeIsIdentical) {
  MakeVFolder();
  fs::create_directories(VfPath() + "/d/e");
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  std::ofstream(VfPath() + "/d/big.bin", std::ios::binary) << big;
  std::ofstream(VfPath() + "/d/e/small.txt") << "small";
  fs::create_symlink("d/big.bin", VfPath() + "/link");
  ::chmod((VfPath() + "/d/e").c_str(), 0700);
  std::string dst = base_ + "/copy";
  ASSERT_TRUE(vol_->fsop().CopyTree(VfPath(), dst).ok());
  EXPECT_EQ(ReadFile(dst + "/d/big.bin"), big);
  EXPECT_EQ(ReadFile(dst + "/d/e/small.txt"), "small");
  EXPECT_EQ(fs::read_symlink(dst + "/link"), "d/big.bin");
  struct stat sb;
  ASSERT_EQ(::stat((dst + "/d/e").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0700u);
  auto a = vol_->fsop().ScanTree(VfPath());
  auto b = vol_->fsop().ScanTree(dst);
  EXPECT_EQ(a->file_count, b->file_count);
  EXPECT_EQ(a->used_bytes, b->used_bytes);
}

TEST_P(Conformance, DetachHidesAtOnce) {
  MakeVFolder();
  std::ofstream(VfPath() + "/f") << "x";
  auto trash = vol_->DetachVFolder(vf_);
  ASSERT_TRUE(trash.ok());
  EXPECT_EQ(vol_->CheckVFolder(vf_).code(), Code::kNotFound);
  EXPECT_TRUE(fs::exists(*trash + "/f"));
  ASSERT_TRUE(vol_->fsop().DeleteTree(*trash).ok());
  EXPECT_FALSE(fs::exists(*trash));
  EXPECT_EQ(vol_->DetachVFolder(vf_).status().code(), Code::kNotFound);
}

// Downloads open files with Lookup::kCachedOnly on event loops: without I/O, saying so
// (kUnavailable) rather than blocking when the lookup is not cached, and with a hint as well.
TEST_P(Conformance, OpenReaderForLookups) {
  EXPECT_EQ(vol_->OpenReader(vf_, "f.txt").status().code(), Code::kNotFound);
  MakeVFolder();
  std::ofstream(VfPath() + "/f.txt") << "data";
  auto hint = vol_->PrepareLookup(vf_, "f.txt");
  for (const LookupHint* h : {static_cast<const LookupHint*>(nullptr), hint.get()}) {
    for (Lookup lookup : {Lookup::kMayBlock, Lookup::kCachedOnly}) {
      auto f = vol_->OpenReader(vf_, "f.txt", lookup, h);
      if (lookup == Lookup::kCachedOnly && !f.ok()) {
        // Nothing cached yet is allowed, but only as kUnavailable.
        EXPECT_EQ(f.status().code(), Code::kUnavailable) << f.status().ToString();
        continue;
      }
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      struct stat b;
      ASSERT_EQ(::stat((VfPath() + "/f.txt").c_str(), &b), 0);
      EXPECT_EQ((*f)->info().ino, b.st_ino);
      EXPECT_EQ((*f)->size(), 4u);
      char buf[8] = {};
      auto n = (*f)->ReadAt(0, buf, sizeof buf);
      ASSERT_TRUE(n.ok());
      EXPECT_EQ(*n, 4u);
      EXPECT_STREQ(buf, "data");
      EXPECT_EQ(vol_->OpenReader(vf_, "../x", lookup, nullptr).status().code(), Code::kInvalidPath);
    }
  }
  // The path was just used: it is in the dentry cache now. (FUSE dentries always need the
  // daemon to revalidate them, so there a cached-only lookup is never possible.)
  auto cached = vol_->OpenReader(vf_, "f.txt", Lookup::kCachedOnly, hint.get());
  if (GetParam().cached_lookups)
    EXPECT_TRUE(cached.ok()) << cached.status().ToString();
  else
    EXPECT_EQ(cached.status().code(), Code::kUnavailable);
  auto trash = vol_->DetachVFolder(vf_);
  ASSERT_TRUE(trash.ok());
  for (Lookup lookup : {Lookup::kMayBlock, Lookup::kCachedOnly}) {
    Code c = vol_->OpenReader(vf_, "f.txt", lookup, nullptr).status().code();
    EXPECT_TRUE(c == Code::kNotFound || (lookup == Lookup::kCachedOnly && c == Code::kUnavailable))
        << CodeName(c);
  }
}

VolumeConfig MakeConfig(const std::string& backend, const std::string& dir) {
  VolumeConfig c;
  c.name = "test";
  c.backend = backend;
  c.path = dir;
  return c;
}

// btrfs: a loop-mounted filesystem with qgroups, shared by the process's btrfs tests.
std::string BtrfsScratch(std::string* error) {
  auto& loop = test::LoopFs::Btrfs();
  *error = loop.error();
  return loop.mount();
}

// xfs: a loop-mounted XFS filesystem with reflinks; limits only where the kernel enforces
// project quotas (not on this project's machines; see docs/decisions.md, "XFS/ext4 backend").
std::string XfsScratch(std::string* error) {
  auto& loop = test::LoopFs::Xfs();
  *error = loop.error();
  return loop.mount();
}

// ext4: a loop-mounted plain ext4 (no `project` feature: with it, ext4 does not mount on a
// kernel without CONFIG_QUOTA, such as this project's machines).
std::string Ext4Scratch(std::string* error) {
  auto& loop = test::LoopFs::Ext4();
  *error = loop.error();
  return loop.mount();
}

bool XfsLimitsEnforced() {
  return std::getenv("SLUICE_XFS_MOUNT_OPTS") &&
         std::string(std::getenv("SLUICE_XFS_MOUNT_OPTS")).find("prjquota") != std::string::npos;
}

// cephfs: a directory on a CephFS mount named by $SLUICE_TEST_CEPHFS. The cluster takes seconds
// to start, so tests/integration/test_cephfs.py runs this instance against its session cluster
// (`--gtest_filter='Backends/Conformance.*/cephfs'`); without the variable there is no instance.
std::string CephfsScratch(std::string* error) {
  const char* dir = std::getenv("SLUICE_TEST_CEPHFS");
  if (!dir || !*dir) *error = "SLUICE_TEST_CEPHFS is not set";
  return dir ? dir : "";
}

std::vector<Backend> Backends() {
  std::vector<Backend> b = {
      Backend{"vfs", [](const std::string& dir) { return MakeConfig("vfs", dir); }},
      Backend{"btrfs", [](const std::string& dir) { return MakeConfig("btrfs", dir); },
              BtrfsScratch, 64 << 10},
      Backend{"xfs", [](const std::string& dir) { return MakeConfig("xfs", dir); }, XfsScratch, 0,
              XfsLimitsEnforced()},
      Backend{"ext4", [](const std::string& dir) { return MakeConfig("ext4", dir); }, Ext4Scratch,
              0, false}};
  if (std::getenv("SLUICE_TEST_CEPHFS"))
    b.push_back(Backend{"cephfs", [](const std::string& dir) { return MakeConfig("cephfs", dir); },
                        CephfsScratch, 0, true, std::chrono::seconds(30), false});
  return b;
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace sluice
