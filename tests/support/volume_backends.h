// The volume backends the volume test suites run on, and the fixture that makes a fresh
// volume of one: the interface suite (interface_test.cc, every backend including the in-memory
// one) and the POSIX layout suite (posix_layout_test.cc, directory-backed backends only).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/thread_pool.h"
#include "support/loop_fs.h"
#include "volume/cache/cached_volume.h"
#include "volume/forwarding_volume.h"
#include "volume/mem/mem_volume.h"
#include "volume/registry.h"
#include "volume/s3/s3_volume.h"

namespace sluice::test {

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
  // Directory-backed (PosixVolume): vfolders are directories at VFolderPath.
  bool posix = true;
  // Decorators the suite serves the backend through (the SSD read cache), given the test's
  // scratch directory.
  std::function<std::unique_ptr<Volume>(std::unique_ptr<Volume>, const std::string&)> wrap;
};

// Names the backend in test output instead of dumping the struct's bytes.
inline void PrintTo(const Backend& b, std::ostream* os) {
  *os << b.name;
}

inline std::string ReadFile(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> Snapshot(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

class VolumeTest : public ::testing::TestWithParam<Backend> {
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
    if (GetParam().wrap) vol_ = GetParam().wrap(std::move(vol_), base_);
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
  // Writes a file behind the volume's back, as another client of its storage would.
  void PutFile(const std::string& rel, const std::string& content) {
    if (auto* s3 = dynamic_cast<S3Volume*>(&ForwardingVolume::Innermost(*vol_))) {
      // Straight to the origin, as another of its clients would.
      io::s3::S3Client c(s3->options().client);
      auto put = c.Put(s3->options().bucket, s3->ObjectKey(vf_, rel), io::s3::Body{content});
      ASSERT_TRUE(put.ok()) << put.status().ToString();
      return;
    }
    if (!GetParam().posix) {
      auto& mem = dynamic_cast<MemVolume&>(ForwardingVolume::Innermost(*vol_));
      ASSERT_TRUE(mem.PutFile(vf_, rel, content).ok());
      return;
    }
    fs::path p = fs::path(VfPath()) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
  }
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

inline VolumeConfig MakeConfig(const std::string& backend, const std::string& dir) {
  VolumeConfig c;
  c.name = "test";
  c.backend = backend;
  c.path = dir;
  return c;
}

// btrfs: a loop-mounted filesystem with qgroups, shared by the process's btrfs tests.
inline std::string BtrfsScratch(std::string* error) {
  auto& loop = LoopFs::Btrfs();
  *error = loop.error();
  return loop.mount();
}

// xfs: a loop-mounted XFS filesystem with reflinks; limits only where the kernel enforces
// project quotas (not on this project's machines; see docs/decisions.md, "XFS/ext4 backend").
inline std::string XfsScratch(std::string* error) {
  auto& loop = LoopFs::Xfs();
  *error = loop.error();
  return loop.mount();
}

// ext4: a loop-mounted plain ext4 (no `project` feature: with it, ext4 does not mount on a
// kernel without CONFIG_QUOTA, such as this project's machines).
inline std::string Ext4Scratch(std::string* error) {
  auto& loop = LoopFs::Ext4();
  *error = loop.error();
  return loop.mount();
}

inline bool XfsLimitsEnforced() {
  return std::getenv("SLUICE_XFS_MOUNT_OPTS") &&
         std::string(std::getenv("SLUICE_XFS_MOUNT_OPTS")).find("prjquota") != std::string::npos;
}

// cephfs: a directory on a CephFS mount named by $SLUICE_TEST_CEPHFS. The cluster takes seconds
// to start, so tests/integration/test_cephfs.py runs this instance against its session cluster
// (`--gtest_filter='Backends/VolumeInterface.*/cephfs:Backends/PosixLayout.*/cephfs'`); without the
// variable there is no instance.
inline std::string CephfsScratch(std::string* error) {
  const char* dir = std::getenv("SLUICE_TEST_CEPHFS");
  if (!dir || !*dir) *error = "SLUICE_TEST_CEPHFS is not set";
  return dir ? dir : "";
}

// The directory-backed backends that run here.
inline std::vector<Backend> PosixBackends() {
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

// s3: a bucket of an S3 origin named by $SLUICE_TEST_S3 ("endpoint bucket access-key
// secret-key"), each test under a prefix of its own. tests/integration/test_s3_volume.py runs
// this instance against a second sluiced and against Ceph RGW
// (`--gtest_filter='Backends/VolumeInterface.*/s3'`); without the variable there is no instance.
inline VolumeConfig S3Config(const std::string& dir) {
  std::istringstream in(std::getenv("SLUICE_TEST_S3"));
  std::string endpoint, bucket, ak, sk;
  in >> endpoint >> bucket >> ak >> sk;
  VolumeConfig c = MakeConfig("s3", dir);
  c.options = {{"endpoint", endpoint},
               {"bucket", bucket},
               {"access-key", ak},
               {"secret-key", sk},
               {"prefix", "conformance/" + fs::path(dir).parent_path().filename().string()}};
  return c;
}

// Every backend: the directory-backed ones, the in-memory one and, when an origin is named,
// the s3 one.
inline std::vector<Backend> AllBackends() {
  std::vector<Backend> b = PosixBackends();
  Backend mem{"mem", [](const std::string& dir) { return MakeConfig("mem", dir); }};
  mem.posix = false;
  b.insert(b.begin(), mem);
  // The in-memory one again, behind the SSD read cache (small blocks, so files span several).
  Backend cached{"cached", [](const std::string& dir) { return MakeConfig("mem", dir); }};
  cached.posix = false;
  cached.wrap = [](std::unique_ptr<Volume> v, const std::string& dir) -> std::unique_ptr<Volume> {
    CacheOptions o;
    o.path = dir + "/cache";
    o.block_size = 4096;
    o.min_free = 0;
    auto store = BlockStore::Open(o.StoreOptions());
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return std::make_unique<CachedVolume>(std::move(v), o, std::move(store).value());
  };
  b.insert(b.begin() + 1, cached);
  if (std::getenv("SLUICE_TEST_S3")) {
    Backend s3{"s3", S3Config};
    s3.posix = false;
    s3.cached_lookups = false;
    b.push_back(s3);
  }
  return b;
}

inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param.name;
}

}  // namespace sluice::test
