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

#include <gtest/gtest.h>

#include "common/thread_pool.h"
#include "volume/registry.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

struct Backend {
  std::string name;
  // Prepares a fresh volume directory and returns its config.
  std::function<VolumeConfig(const std::string& dir)> make_config;
};

// Names the backend in test output instead of dumping the struct's bytes.
void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

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
    char tmpl[] = "/tmp/sluice-conf-XXXXXX";
    base_ = mkdtemp(tmpl);
    mount_ = base_ + "/vol";
    fs::create_directories(mount_);
    pool_ = std::make_unique<ThreadPool>("scan", 4);
    VolumeConfig cfg = GetParam().make_config(mount_);
    auto v = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{pool_.get()});
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    vol_ = std::move(v).value();
    ASSERT_TRUE(vol_->Init().ok());
    qs_ = QuotaScopeId::Parse("user:11111111111111111111111111111111").value();
    vf_ = VFolderId::Parse(
              "user:11111111111111111111111111111111/"
              "abcdef0123456789abcdef0123456789")
              .value();
  }
  void TearDown() override {
    vol_.reset();
    pool_.reset();
    fs::remove_all(base_);
  }
  void MakeVFolder() { ASSERT_TRUE(vol_->CreateVFolder(vf_, 0755, true, std::nullopt).ok()); }
  std::string VfPath() { return vol_->VFolderPath(vf_); }

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
  ASSERT_TRUE((*v)->Init().ok());
  EXPECT_EQ((*v)->layout_version(), 2);
  EXPECT_FALSE(fs::exists(base_ + "/old/version.txt"));
  auto legacy = VFolderId::Parse("abcdef0123456789abcdef0123456789").value();
  EXPECT_EQ((*v)->VFolderPath(legacy), base_ + "/old/ab/cd/ef0123456789abcdef0123456789");
}

TEST_P(Conformance, QuotaScopeLifecycle) {
  auto& q = vol_->quota();
  EXPECT_EQ(q.DescribeScope(qs_).status().code(), Code::kNotFound);
  ASSERT_TRUE(q.CreateScope(qs_, 1 << 20).ok());
  EXPECT_EQ(q.CreateScope(qs_, std::nullopt).code(), Code::kAlreadyExists);
  auto d = q.DescribeScope(qs_);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->used_bytes, 0u);
  ASSERT_TRUE(d->limit_bytes.has_value());
  EXPECT_EQ(*d->limit_bytes, 1u << 20);
  ASSERT_TRUE(q.UpdateScope(qs_, 2 << 20).ok());
  EXPECT_EQ(*q.DescribeScope(qs_)->limit_bytes, 2u << 20);
  ASSERT_TRUE(q.UnsetQuota(qs_).ok());
  EXPECT_FALSE(q.DescribeScope(qs_)->limit_bytes.has_value());
  EXPECT_TRUE(fs::is_directory(q.ScopePath(qs_)));
  ASSERT_TRUE(q.DeleteScope(qs_).ok());
  EXPECT_FALSE(fs::exists(q.ScopePath(qs_)));
  EXPECT_EQ(q.DeleteScope(qs_).code(), Code::kNotFound);
  EXPECT_EQ(q.UnsetQuota(qs_).code(), Code::kNotFound);
}

TEST_P(Conformance, UpdateCreatesMissingScope) {
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
  ASSERT_TRUE(vol_->CreateVFolder(vf_, 0750, true, 12345).ok());
  std::string expect =
      mount_ + "/11111111111111111111111111111111/ab/cd/ef0123456789abcdef0123456789";
  EXPECT_EQ(VfPath(), expect);
  struct stat sb;
  ASSERT_EQ(::stat(expect.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0750u);
  EXPECT_EQ(*vol_->quota().DescribeScope(qs_)->limit_bytes, 12345u);
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
  auto u = vol_->GetUsage(vf_);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->used_bytes, 6000u);
  EXPECT_EQ(u->file_count, 5u);  // 3 files + 2 directories
  EXPECT_EQ(*vol_->GetUsedBytes(vf_), 6000u);
  EXPECT_EQ(vol_->quota().DescribeScope(qs_)->used_bytes, 6000u);
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
  auto f = vol_->OpenForRead(vf_, "h.txt");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->size, 4u);
  EXPECT_EQ(vol_->OpenForRead(vf_, "x").status().code(), Code::kInvalidArgument);
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
  EXPECT_EQ(vol_->OpenForRead(vf_, "out/outside.txt").status().code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->OpenForRead(vf_, "/etc/passwd").status().code(), Code::kInvalidPath);
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

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         ::testing::Values(Backend{"vfs",
                                                   [](const std::string& dir) {
                                                     VolumeConfig c;
                                                     c.name = "test";
                                                     c.backend = "vfs";
                                                     c.path = dir;
                                                     return c;
                                                   }}),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace sluice
