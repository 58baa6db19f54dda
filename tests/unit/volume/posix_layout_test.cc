// The POSIX layout suite: what directory-backed volumes (PosixVolume and its subclasses) keep
// on disk (layout versions, vfolder paths and modes, the trash), their defence against symbolic
// links, tree copies and dentry-cache lookups. Behaviour every backend shares is the interface
// suite's (interface_test.cc).
#include "support/volume_backends.h"

namespace sluice::test {
namespace {

class PosixLayout : public VolumeTest {};

TEST_P(PosixLayout, NewVolumeUsesLayoutV3) {
  EXPECT_EQ(vol_->layout_version(), 3);
  EXPECT_EQ(ReadFile(mount_ + "/version.txt"), "3\n");
  EXPECT_TRUE(vol_->capabilities().count(kCapVFolder));
}

TEST_P(PosixLayout, ExistingVolumeWithoutVersionIsV2) {
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

TEST_P(PosixLayout, VFolderLayoutAndMode) {
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

TEST_P(PosixLayout, HostilePathsChangeNothing) {
  MakeVFolder();
  std::ofstream(base_ + "/outside.txt") << "keep";
  std::ofstream(VfPath() + "/in.txt") << "in";
  fs::create_symlink(base_, VfPath() + "/out");
  auto before = Snapshot(base_);
  EXPECT_EQ(vol_->Mkdir(vf_, "../evil", true, false).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->Mkdir(vf_, "out/evil", true, false).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->OpenReader(vf_, "out/outside.txt").status().code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->OpenReader(vf_, "/etc/passwd").status().code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->ListSorted(vf_, "out", "", SIZE_MAX).status().code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->DeleteFiles(vf_, {"in.txt", "out/outside.txt"}, true).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->Move(vf_, "in.txt", "out/moved.txt").code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->Rename(vf_, "in.txt", std::string("a\0b", 3)).code(), Code::kInvalidPath);
  EXPECT_EQ(vol_->MountPath(vf_, "out/x").status().code(), Code::kInvalidPath);
  EXPECT_EQ(Snapshot(base_), before);
  // Deleting the symlink itself removes the link, never its target.
  ASSERT_TRUE(vol_->DeleteFiles(vf_, {"out"}, true).ok());
  EXPECT_EQ(ReadFile(base_ + "/outside.txt"), "keep");
}

TEST_P(PosixLayout, CopyTreeIsIdentical) {
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

TEST_P(PosixLayout, DetachHidesAtOnce) {
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

TEST_P(PosixLayout, ScopesAreDirectories) {
  ASSERT_TRUE(vol_->quota().CreateScope(qs_, std::nullopt).ok());
  EXPECT_TRUE(fs::is_directory(vol_->quota().ScopePath(qs_)));
  ASSERT_TRUE(vol_->quota().DeleteScope(qs_).ok());
  EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(qs_)));
  if (!GetParam().limits) {
    // Refused before anything is made.
    EXPECT_EQ(vol_->quota().CreateScope(qs_, 1 << 20).code(), Code::kUnsupported);
    EXPECT_FALSE(fs::exists(vol_->quota().ScopePath(qs_)));
  }
}

// A temporary copy of a scope's bookkeeping file that a crash left behind (WriteFileAtomic)
// does not keep the scope from being deleted. Before, the emptiness check passed over it and
// the rmdir then failed on it: every delete of that empty scope was 409.
TEST_P(PosixLayout, ACrashedBookkeepingWriteDoesNotKeepTheScope) {
  std::optional<uint64_t> limit;
  if (GetParam().limits) limit = 1 << 20;
  ASSERT_TRUE(vol_->quota().CreateScope(qs_, limit).ok());
  const std::string dir = vol_->quota().ScopePath(qs_);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path().string());
  for (const auto& f : files) std::ofstream(f + ".tmp.12.0") << "half";
  Status st = vol_->quota().DeleteScope(qs_);
  EXPECT_TRUE(st.ok()) << st.ToString() << " (" << files.size() << " bookkeeping files)";
  EXPECT_FALSE(fs::exists(dir));
}

// A FIFO is refused at once instead of blocking the reader until a writer appears.
TEST_P(PosixLayout, FifosAreRefusedWithoutWaiting) {
  MakeVFolder();
  ASSERT_EQ(::mkfifo((VfPath() + "/fifo").c_str(), 0644), 0);
  EXPECT_EQ(vol_->OpenReader(vf_, "fifo").status().code(), Code::kInvalidArgument);
  auto dir = vol_->OpenDir(vf_, ".");
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ((*dir)->OpenFile("fifo").status().code(), Code::kInvalidArgument);
}

// Downloads open files with Lookup::kCachedOnly on event loops: without I/O, saying so
// (kUnavailable) rather than blocking when the lookup is not cached, and with a hint as well.
TEST_P(PosixLayout, OpenReaderForLookups) {
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

INSTANTIATE_TEST_SUITE_P(Backends, PosixLayout, ::testing::ValuesIn(PosixBackends()), BackendName);

}  // namespace
}  // namespace sluice::test
