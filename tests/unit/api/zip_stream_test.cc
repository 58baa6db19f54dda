// The ZIP stream's memory bounds: an archive whose central directory would grow past its
// entry count or the summed length of its entries' names fails with kTooLarge instead of
// holding them all; within both it is a ZIP that libarchive reads back whole. A deep tree
// keeps at most kMaxOpenZipDirs directories open.
#include "api/zip_stream.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "support/assert_status.h"
#include "support/volume_backends.h"
#include "volume/forwarding_volume.h"
#include "volume/mem/mem_volume.h"

namespace sluice::api {
namespace {

class ZipStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vol_ = std::make_unique<MemVolume>(test::MakeConfig("mem", "mem"), 1ULL << 30);
    vf_ = VFolderId::Parse(
              "user:11111111111111111111111111111111/"
              "abcdef0123456789abcdef0123456789")
              .value();
    ASSERT_OK(vol_->CreateVFolder(vf_, 0755, true, std::nullopt));
    // "d" and four files whose names (with "d/") are 52 bytes each: 1 + 4 * 52 in all.
    for (char c : std::string("abcd"))
      ASSERT_OK(vol_->PutFile(vf_, "d/" + std::string(50, c), std::string(10, c)));
  }
  // The whole stream, or the status that ended it.
  Result<std::string> Drain(ZipLimits limits) {
    std::vector<ZipSource> src(1);
    src[0].arcname = "d";
    src[0].rel = "d";
    ZipStream z(vol_.get(), vf_, std::move(src), "test", limits);
    std::string out;
    char buf[4096];
    for (;;) {
      SLUICE_ASSIGN_OR_RETURN(size_t n, z.Read(buf, sizeof buf));
      if (n == 0) break;
      out.append(buf, n);
    }
    return out;
  }
  static std::set<std::string> Names(const std::string& zip) {
    std::set<std::string> names;
    struct archive* a = archive_read_new();
    archive_read_support_format_zip(a);
    EXPECT_EQ(archive_read_open_memory(a, zip.data(), zip.size()), ARCHIVE_OK);
    struct archive_entry* e;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK) names.insert(archive_entry_pathname(e));
    archive_read_free(a);
    return names;
  }

  std::unique_ptr<MemVolume> vol_;
  VFolderId vf_;
};

TEST_F(ZipStreamTest, WithinItsBoundsTheArchiveIsWhole) {
  auto zip = Drain({.entries = 5, .name_bytes = 1 + 4 * 52});
  ASSERT_OK(zip);
  auto names = Names(*zip);
  EXPECT_EQ(names.size(), 5u);
  EXPECT_TRUE(names.count("d/" + std::string(50, 'c')));
}

TEST_F(ZipStreamTest, TooManyEntriesFailTheStream) {
  auto zip = Drain({.entries = 4, .name_bytes = 1 << 20});
  ASSERT_FALSE(zip.ok());
  EXPECT_EQ(zip.status().code(), Code::kTooLarge);
  EXPECT_NE(zip.status().message().find("more than 4 entries"), std::string::npos)
      << zip.status().message();
}

// Few entries with long names (a deep tree's) cost as much as many: they are bounded too.
TEST_F(ZipStreamTest, NamesPastTheirBoundFailTheStream) {
  auto zip = Drain({.entries = 1000, .name_bytes = 1 + 4 * 52 - 1});
  ASSERT_FALSE(zip.ok());
  EXPECT_EQ(zip.status().code(), Code::kTooLarge);
  EXPECT_NE(zip.status().message().find("names add up to more than"), std::string::npos)
      << zip.status().message();
}

// Directory handles of a volume that count how many are open at once.
struct OpenCount {
  int now = 0, most = 0;
  void Add(int d) { most = std::max(most, now += d); }
};

class CountedDir : public ForwardingDirHandle {
 public:
  CountedDir(std::unique_ptr<DirHandle> d, OpenCount* c)
      : ForwardingDirHandle(std::move(d)), c_(c) {
    c_->Add(1);
  }
  ~CountedDir() override { c_->Add(-1); }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& n) override {
    SLUICE_ASSIGN_OR_RETURN(auto d, inner_->OpenSubdir(n));
    return std::unique_ptr<DirHandle>(new CountedDir(std::move(d), c_));
  }

 private:
  OpenCount* c_;
};

class CountingVolume : public ForwardingVolume {
 public:
  using ForwardingVolume::ForwardingVolume;
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid, std::string_view rel) override {
    SLUICE_ASSIGN_OR_RETURN(auto d, ForwardingVolume::OpenDir(vfid, rel));
    return std::unique_ptr<DirHandle>(new CountedDir(std::move(d), &open));
  }
  OpenCount open;
};

// The archive of directory `rel` of `v`'s vfolder, or the status that ended it.
Result<std::string> ArchiveOf(Volume& v, const std::string& rel) {
  std::vector<ZipSource> src(1);
  src[0].arcname = rel;
  src[0].rel = rel;
  ZipStream z(&v,
              VFolderId::Parse("user:11111111111111111111111111111111/"
                               "abcdef0123456789abcdef0123456789")
                  .value(),
              std::move(src), "test");
  std::string zip;
  char buf[4096];
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(size_t n, z.Read(buf, sizeof buf));
    if (n == 0) return zip;
    zip.append(buf, n);
  }
}

// 40 levels, each with files before and after its subdirectory: at most kMaxOpenZipDirs
// directories are open at once (one more while one is opened again), and the archive holds
// every file of every level.
TEST_F(ZipStreamTest, ADeepTreeKeepsFewDirectoriesOpen) {
  std::string dir = "deep";
  std::set<std::string> want = {"deep"};
  for (int level = 0; level < 40; ++level) {
    for (const char* f : {"a.txt", "z.txt"}) {
      ASSERT_OK(vol_->PutFile(vf_, dir + "/" + f, dir));
      want.insert(dir + "/" + f);
    }
    dir += "/m";
    want.insert(dir);
  }
  ASSERT_OK(vol_->PutFile(vf_, dir + "/last", "x"));
  want.insert(dir + "/last");
  CountingVolume counted(std::move(vol_));
  auto zipped = ArchiveOf(counted, "deep");
  ASSERT_OK(zipped);
  const std::string& zip = *zipped;
  EXPECT_EQ(counted.open.now, 0);
  static_assert(kMaxOpenZipDirs + 1 < 40);
  EXPECT_LE(counted.open.most, static_cast<int>(kMaxOpenZipDirs) + 1);
  EXPECT_GT(counted.open.most, 1);
  std::set<std::string> got;
  for (auto n : Names(zip)) {
    if (n.ends_with("/")) n.pop_back();
    got.insert(n);
  }
  EXPECT_EQ(got, want);
}

// Two deep chains side by side, then a file: the top directory is closed, opened again, and
// closed again below the second chain; each entry is in the archive once.
TEST_F(ZipStreamTest, ADirectoryClosedTwiceListsEachNameOnce) {
  std::set<std::string> want = {"two"};
  for (const char* top : {"p", "q"}) {
    std::string dir = std::string("two/") + top;
    want.insert(dir);
    for (int level = 0; level < 20; ++level) {
      ASSERT_OK(vol_->PutFile(vf_, dir + "/f", "x"));
      want.insert(dir + "/f");
      dir += "/m";
      want.insert(dir);
    }
    ASSERT_OK(vol_->PutFile(vf_, dir + "/f", "x"));
    want.insert(dir + "/f");
  }
  ASSERT_OK(vol_->PutFile(vf_, "two/z", "z"));
  want.insert("two/z");
  CountingVolume counted(std::move(vol_));
  auto zipped = ArchiveOf(counted, "two");
  ASSERT_OK(zipped);
  const std::string& zip = *zipped;
  EXPECT_LE(counted.open.most, static_cast<int>(kMaxOpenZipDirs) + 1);
  std::multiset<std::string> got;
  struct archive* a = archive_read_new();
  archive_read_support_format_zip(a);
  ASSERT_EQ(archive_read_open_memory(a, zip.data(), zip.size()), ARCHIVE_OK);
  struct archive_entry* e;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    std::string n = archive_entry_pathname(e);
    if (n.ends_with("/")) n.pop_back();
    got.insert(n);
  }
  archive_read_free(a);
  EXPECT_EQ(got, std::multiset<std::string>(want.begin(), want.end()));
}

}  // namespace
}  // namespace sluice::api
