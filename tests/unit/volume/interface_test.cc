// The interface suite: what every Volume backend does the same, checked through the interface
// alone (out-of-band writes through the fixture's PutFile hook), on every backend that runs
// here: the in-memory one and the directory-backed ones (vfs, btrfs, xfs, ext4; cephfs when
// tests/integration/test_cephfs.py runs it). A new backend is done when it passes.
#include <algorithm>

#include <fmt/format.h>

#include "service/s3/objects.h"
#include "support/assert_status.h"
#include "support/listing_oracle.h"
#include "support/volume_backends.h"
#include "volume/key_order.h"

namespace sluice::test {
namespace {

class VolumeInterface : public VolumeTest {};

std::string ReadAll(FileReader& f) {
  std::string out(f.size(), '\0');
  size_t done = 0;
  while (done < out.size()) {
    auto n = f.ReadAt(done, out.data() + done, out.size() - done);
    if (!n.ok() || *n == 0) break;
    done += *n;
  }
  out.resize(done);
  return out;
}

std::vector<std::string> Names(const std::vector<DirEntry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.name);
  return out;
}

TEST_P(VolumeInterface, QuotaScopeLifecycle) {
  auto& q = vol_->quota();
  ASSERT_ERROR(q.DescribeScope(qs_), Code::kNotFound);
  ASSERT_ERROR(q.ScopeLimit(qs_), Code::kNotFound);
  if (!GetParam().limits) {
    EXPECT_ERROR(q.CreateScope(qs_, 1 << 20), Code::kUnsupported);
    ASSERT_OK(q.CreateScope(qs_, std::nullopt));
  } else {
    ASSERT_OK(q.CreateScope(qs_, 1 << 20));
  }
  EXPECT_ERROR(q.CreateScope(qs_, std::nullopt), Code::kAlreadyExists);
  auto d = q.DescribeScope(qs_);
  ASSERT_OK(d);
  ExpectUsage(d->used_bytes, 0);
  if (GetParam().limits) {
    ASSERT_TRUE(d->limit_bytes.has_value());
    EXPECT_EQ(*d->limit_bytes, 1u << 20);
    EXPECT_EQ(q.ScopeLimit(qs_).value(), std::optional<uint64_t>(1u << 20));
    ASSERT_OK(q.UpdateScope(qs_, 2 << 20));
    EXPECT_EQ(*q.DescribeScope(qs_)->limit_bytes, 2u << 20);
    EXPECT_EQ(q.ScopeLimit(qs_).value(), std::optional<uint64_t>(2u << 20));
  } else {
    EXPECT_FALSE(d->limit_bytes.has_value());
    EXPECT_ERROR(q.UpdateScope(qs_, 2 << 20), Code::kUnsupported);
  }
  ASSERT_OK(q.UnsetQuota(qs_));
  EXPECT_FALSE(q.DescribeScope(qs_)->limit_bytes.has_value());
  EXPECT_FALSE(q.ScopeLimit(qs_).value().has_value());
  ASSERT_OK(q.DeleteScope(qs_));
  EXPECT_ERROR(q.DeleteScope(qs_), Code::kNotFound);
  EXPECT_ERROR(q.UnsetQuota(qs_), Code::kNotFound);
}

TEST_P(VolumeInterface, UpdateCreatesMissingScope) {
  if (!GetParam().limits) {
    EXPECT_ERROR(vol_->quota().UpdateScope(qs_, 4096), Code::kUnsupported);
    EXPECT_ERROR(vol_->quota().DescribeScope(qs_), Code::kNotFound);
    return;
  }
  ASSERT_OK(vol_->quota().UpdateScope(qs_, 4096));
  EXPECT_EQ(*vol_->quota().DescribeScope(qs_)->limit_bytes, 4096u);
}

TEST_P(VolumeInterface, ScopeWithVFoldersCannotBeDeleted) {
  MakeVFolder();
  EXPECT_ERROR(vol_->quota().DeleteScope(qs_), Code::kNotEmpty);
  auto trash = vol_->DetachVFolder(vf_);
  ASSERT_OK(trash);
  ASSERT_OK(vol_->fsop().DeleteTree(*trash));
  EXPECT_OK(vol_->quota().DeleteScope(qs_));
}

TEST_P(VolumeInterface, VFoldersComeAndGo) {
  EXPECT_ERROR(vol_->CreateVFolder(vf_, 0755, false, std::nullopt), Code::kNotFound);
  EXPECT_ERROR(vol_->CreateVFolder(vf_, 010000, true, std::nullopt), Code::kInvalidArgument);
  ASSERT_OK(vol_->CreateVFolder(vf_, 0750, true, std::nullopt));
  EXPECT_ERROR(vol_->CreateVFolder(vf_, 0755, true, std::nullopt), Code::kAlreadyExists);
  auto root = vol_->Stat(vf_, "");
  ASSERT_OK(root);
  EXPECT_EQ(root->type, EntryType::kDirectory);
  EXPECT_EQ(root->mode & 07777, 0750u);
  PutFile("f", "x");
  auto trash = vol_->DetachVFolder(vf_);
  ASSERT_OK(trash);
  EXPECT_ERROR(vol_->CheckVFolder(vf_), Code::kNotFound);
  EXPECT_ERROR(vol_->OpenReader(vf_, "f"), Code::kNotFound);
  EXPECT_ERROR(vol_->DetachVFolder(vf_), Code::kNotFound);
  ASSERT_OK(vol_->fsop().DeleteTree(*trash));
}

TEST_P(VolumeInterface, UsageCountsFilesAndBytes) {
  MakeVFolder();
  PutFile("a.bin", std::string(1000, 'a'));
  PutFile("d1/b.bin", std::string(2000, 'b'));
  PutFile("d1/d2/c.bin", std::string(3000, 'c'));
  // Written behind the volume's back: a maintained figure (vfs) sees it once re-measured.
  ASSERT_OK(vol_->GetFreshUsage(vf_));
  ExpectUsage(Settled([&] { return vol_->GetFreshUsage(vf_)->used_bytes; }, 6000), 6000);
  auto u = vol_->GetUsage(vf_);
  ASSERT_OK(u);
  ExpectUsage(u->used_bytes, 6000);
  EXPECT_EQ(Settled([&] { return vol_->GetUsage(vf_)->file_count; }, 5), 5u);  // 3 files, 2 dirs
  ExpectUsage(*vol_->GetUsedBytes(vf_), 6000);
  ExpectUsage(Settled([&] { return vol_->quota().DescribeScope(qs_)->used_bytes; }, 6000), 6000);
  auto missing = VFolderId::Parse(
                     "user:11111111111111111111111111111111/"
                     "00000000000000000000000000000000")
                     .value();
  EXPECT_ERROR(vol_->GetUsage(missing), Code::kNotFound);
}

TEST_P(VolumeInterface, FileOperations) {
  MakeVFolder();
  ASSERT_OK(vol_->Mkdir(vf_, "x/y/z", true, false));
  EXPECT_ERROR(vol_->Mkdir(vf_, "x/y/z", true, false), Code::kAlreadyExists);
  EXPECT_OK(vol_->Mkdir(vf_, "x/y/z", true, true));
  EXPECT_ERROR(vol_->Mkdir(vf_, "p/q", false, false), Code::kNotFound);
  PutFile("x/f.txt", "data");
  auto list = vol_->ListSorted(vf_, "x", "", SIZE_MAX);
  ASSERT_OK(list);
  ASSERT_EQ(list->size(), 2u);
  ASSERT_OK(vol_->Rename(vf_, "x/f.txt", "g.txt"));
  EXPECT_ERROR(vol_->Stat(vf_, "x/f.txt"), Code::kNotFound);
  EXPECT_EQ(vol_->Stat(vf_, "x/g.txt")->size, 4u);
  EXPECT_ERROR(vol_->Rename(vf_, "x/g.txt", "../g.txt"), Code::kInvalidPath);
  ASSERT_OK(vol_->Move(vf_, "x/g.txt", "x/y"));  // into an existing directory
  EXPECT_OK(vol_->Stat(vf_, "x/y/g.txt"));
  ASSERT_OK(vol_->Move(vf_, "x/y/g.txt", "h.txt"));
  // Onto its own name: the name is taken, as renameat2 with RENAME_NOREPLACE says.
  EXPECT_ERROR(vol_->Rename(vf_, "h.txt", "h.txt"), Code::kAlreadyExists);
  EXPECT_EQ(vol_->Stat(vf_, "h.txt")->size, 4u);
  // A rename onto a directory's name never moves into it, and a directory never moves onto
  // itself (the in-memory volume used to make it its own child, and lose it): refused, and
  // nothing changes.
  ASSERT_OK(vol_->Mkdir(vf_, "x/w", false, false));
  EXPECT_FALSE(vol_->Rename(vf_, "x/y", "w").ok());
  EXPECT_OK(vol_->Stat(vf_, "x/y/z"));
  EXPECT_ERROR(vol_->Stat(vf_, "x/w/y"), Code::kNotFound);
  EXPECT_FALSE(vol_->Move(vf_, "x/y", "x/y").ok());
  EXPECT_OK(vol_->Stat(vf_, "x/y/z"));
  ASSERT_OK(vol_->DeleteFiles(vf_, {"x/w"}, true));
  auto f = vol_->OpenReader(vf_, "h.txt");
  ASSERT_OK(f);
  EXPECT_EQ((*f)->size(), 4u);
  EXPECT_EQ(ReadAll(**f), "data");
  auto dir = vol_->OpenReader(vf_, "x");
  ASSERT_ERROR(dir, Code::kInvalidArgument);
  EXPECT_EQ(dir.status().sys_errno(), EISDIR);
  EXPECT_ERROR(vol_->DeleteFiles(vf_, {"x"}, false), Code::kNotEmpty);
  EXPECT_OK(vol_->Stat(vf_, "x/y/z"));
  // One bad path deletes nothing.
  EXPECT_ERROR(vol_->DeleteFiles(vf_, {"h.txt", "../x"}, true), Code::kInvalidPath);
  EXPECT_OK(vol_->Stat(vf_, "h.txt"));
  // A path below another of the batch, or named twice, is deleted with it: the batch
  // succeeds (it used to delete, then fail on the path already gone).
  ASSERT_OK(vol_->DeleteFiles(vf_, {"x", "x/y/z", "h.txt", "h.txt"}, true));
  EXPECT_TRUE(vol_->ListSorted(vf_, ".", "", SIZE_MAX)->empty());
  ASSERT_OK(vol_->Mkdir(vf_, "e", false, false));
  ASSERT_OK(vol_->DeleteFiles(vf_, {"e", "e"}, false));
  EXPECT_ERROR(vol_->Stat(vf_, "e"), Code::kNotFound);
}

TEST_P(VolumeInterface, ReadersSeeTheVersionTheyOpened) {
  MakeVFolder();
  PutFile("v.bin", "first version");
  auto f = vol_->OpenReader(vf_, "v.bin");
  ASSERT_OK(f);
  const DirEntry before = (*f)->info();
  EXPECT_EQ(before.type, EntryType::kFile);
  EXPECT_EQ(before.size, 13u);
  char buf[5] = {};
  auto n = (*f)->ReadAt(6, buf, 5);
  ASSERT_OK(n);
  EXPECT_EQ(std::string(buf, *n), "versi");
  EXPECT_EQ(*(*f)->ReadAt(13, buf, 5), 0u);  // at the end: nothing, not an error
  // Replaced whole, the way every writer replaces (a new file renamed into place): the new
  // version has a new validator.
  PutFile("v.bin.new", "second, longer version");
  ASSERT_OK(vol_->DeleteFiles(vf_, {"v.bin"}, false));
  ASSERT_OK(vol_->Rename(vf_, "v.bin.new", "v.bin"));
  auto g = vol_->OpenReader(vf_, "v.bin");
  ASSERT_OK(g);
  EXPECT_EQ((*g)->size(), 22u);
  EXPECT_TRUE((*g)->info().ino != before.ino || (*g)->info().etag != before.etag);
  EXPECT_EQ(ReadAll(**f), "first version");
}

TEST_P(VolumeInterface, DirectoryHandlesAndSortedListings) {
  MakeVFolder();
  for (const char* name : {"b", "a", "d", "c"}) PutFile(std::string("dir/") + name, name);
  ASSERT_OK(vol_->Mkdir(vf_, "dir/sub", true, false));
  PutFile("dir/sub/deep", "deep");
  auto page = vol_->ListSorted(vf_, "dir", "", 2);
  ASSERT_OK(page);
  EXPECT_EQ(Names(*page), (std::vector<std::string>{"a", "b"}));
  page = vol_->ListSorted(vf_, "dir", "b", 10);  // resumes after a name
  ASSERT_OK(page);
  EXPECT_EQ(Names(*page), (std::vector<std::string>{"c", "d", "sub"}));
  EXPECT_EQ(page->back().type, EntryType::kDirectory);
  EXPECT_EQ((*page)[0].size, 1u);
  EXPECT_TRUE(vol_->ListSorted(vf_, "dir", "sub", 10)->empty());
  EXPECT_ERROR(vol_->ListSorted(vf_, "dir/a", "", 10), Code::kInvalidArgument);
  // Paging through a bigger directory, a few names at a time, gives every name once, in order.
  std::vector<std::string> all;
  for (int i = 0; i < 150; ++i) all.push_back(fmt::format("n{:03}", (i * 67) % 150));
  for (const auto& n : all) PutFile("many/" + n, "");
  std::sort(all.begin(), all.end());
  std::vector<std::string> paged;
  for (std::string after;;) {
    auto p = vol_->ListSorted(vf_, "many", after, 7);
    ASSERT_OK(p);
    if (p->empty()) break;
    for (const auto& e : *p) paged.push_back(e.name);
    after = paged.back();
  }
  EXPECT_EQ(paged, all);
  // The vfolder root lists as any directory, by "" and by ".".
  for (const char* root : {"", "."}) {
    auto top = vol_->ListSorted(vf_, root, "", 10);
    ASSERT_OK(top);
    EXPECT_EQ(Names(*top), (std::vector<std::string>{"dir", "many"})) << "'" << root << "'";
  }
  PutFile("top.txt", "t");
  auto rootdir = vol_->OpenDir(vf_, "");
  ASSERT_OK(rootdir);
  size_t at_root = 0;
  for (;;) {
    auto next = (*rootdir)->Next();
    ASSERT_OK(next);
    if (!*next) break;
    at_root += (*next)->name == "top.txt" || (*next)->name == "dir" || (*next)->name == "many";
  }
  EXPECT_EQ(at_root, 3u);
  EXPECT_EQ(ReadAll(**(*rootdir)->OpenFile("top.txt")), "t");

  auto dir = vol_->OpenDir(vf_, "dir");
  ASSERT_OK(dir);
  EXPECT_EQ((*dir)->info().type, EntryType::kDirectory);
  std::vector<std::string> seen;
  for (;;) {
    auto next = (*dir)->Next();
    ASSERT_OK(next);
    if (!*next) break;
    seen.push_back((*next)->name);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c", "d", "sub"}));
  auto sub = (*dir)->OpenSubdir("sub");
  ASSERT_OK(sub);
  auto deep = (*sub)->OpenFile("deep");
  ASSERT_OK(deep);
  EXPECT_EQ(ReadAll(**deep), "deep");
  EXPECT_EQ((*dir)->StatEntry("c")->size, 1u);
  EXPECT_ERROR((*dir)->OpenFile("sub"), Code::kInvalidArgument);
  EXPECT_ERROR((*dir)->OpenSubdir("a"), Code::kInvalidArgument);
  EXPECT_ERROR((*dir)->OpenFile("missing"), Code::kNotFound);
  EXPECT_ERROR(vol_->OpenDir(vf_, "dir/a"), Code::kInvalidArgument);
}

TEST_P(VolumeInterface, HostilePathsAreRefusedAsText) {
  MakeVFolder();
  PutFile("in.txt", "in");
  for (const std::string& bad :
       std::vector<std::string>{"../x", "a/../../x", "/etc/passwd", std::string("a\0b", 3)}) {
    EXPECT_ERROR(vol_->OpenReader(vf_, bad), Code::kInvalidPath) << bad;
    EXPECT_ERROR(vol_->Stat(vf_, bad), Code::kInvalidPath) << bad;
    EXPECT_ERROR(vol_->Mkdir(vf_, bad, true, false), Code::kInvalidPath) << bad;
    EXPECT_ERROR(vol_->OpenDir(vf_, bad), Code::kInvalidPath) << bad;
    EXPECT_ERROR(vol_->DeleteFiles(vf_, {"in.txt", bad}, true), Code::kInvalidPath) << bad;
    EXPECT_ERROR(vol_->Move(vf_, "in.txt", bad), Code::kInvalidPath) << bad;
  }
  EXPECT_ERROR(vol_->Rename(vf_, "in.txt", "a/b"), Code::kInvalidPath);
  EXPECT_EQ(ReadAll(**vol_->OpenReader(vf_, "in.txt")), "in");
}

TEST_P(VolumeInterface, StagingLifecycle) {
  MakeVFolder();
  auto session = vol_->CreateStaging(vf_);
  ASSERT_OK(session);
  auto st = vol_->InspectStaging(vf_, *session);
  ASSERT_OK(st);
  EXPECT_TRUE(st->staged);
  EXPECT_EQ(st->durable, 0u);
  {
    auto w = vol_->OpenStaging(vf_, *session);
    ASSERT_OK(w);
    // One writer at a time.
    EXPECT_ERROR(vol_->OpenStaging(vf_, *session), Code::kConflict);
    size_t written = 0;
    ASSERT_OK((*w)->WriteAt(0, "hello ", 6, &written));
    EXPECT_EQ(written, 6u);
    ASSERT_OK((*w)->Sync(6, true));
    ASSERT_OK((*w)->WriteAt(6, "never synced", 12, &written));
  }
  // What was not synced does not count: the next writer finds the durable offset only.
  auto w = vol_->OpenStaging(vf_, *session);
  ASSERT_OK(w);
  EXPECT_EQ((*w)->state().durable, 6u);
  EXPECT_EQ((*w)->state().staged_size, 6u);
  EXPECT_TRUE((*w)->state().quota_checked);
  size_t written = 0;
  ASSERT_OK((*w)->WriteAt(6, "world", 5, &written));
  ASSERT_OK((*w)->Sync(11, true));
  // A directory in the way is refused; the bytes stay.
  ASSERT_OK(vol_->Mkdir(vf_, "taken", true, false));
  EXPECT_ERROR((*w)->Commit({"taken"}), Code::kConflict);
  ASSERT_OK((*w)->Commit({"out", "greeting.txt"}));
  // The version the commit says it made is the one the volume shows: a cache keeps the bytes
  // it saw written under it (ingest on write).
  {
    auto landed = (*w)->Landed();
    ASSERT_TRUE(landed.has_value());
    auto now = vol_->Stat(vf_, "out/greeting.txt");
    ASSERT_OK(now);
    EXPECT_EQ(landed->size, 11u);
    EXPECT_EQ(landed->size, now->size);
    EXPECT_EQ(landed->etag, now->etag);
    if (landed->etag.empty()) {  // named by inode, size and times
      EXPECT_EQ(landed->ino, now->ino);
      EXPECT_EQ(landed->modified, now->modified);
      EXPECT_EQ(landed->changed, now->changed);
    }
  }
  w->reset();
  EXPECT_EQ(ReadAll(**vol_->OpenReader(vf_, "out/greeting.txt")), "hello world");
  st = vol_->InspectStaging(vf_, *session);
  ASSERT_OK(st);
  EXPECT_FALSE(st->staged);  // committed: the record says how far it got
  EXPECT_TRUE(st->recorded);
  EXPECT_EQ(st->durable, 11u);
  EXPECT_ERROR(vol_->OpenStaging(vf_, *session), Code::kNotFound);

  // Another session, rolled back, then discarded.
  auto other = vol_->CreateStaging(vf_);
  ASSERT_OK(other);
  {
    auto ow = vol_->OpenStaging(vf_, *other);
    ASSERT_OK(ow);
    ASSERT_OK((*ow)->WriteAt(0, "abc", 3, &written));
    ASSERT_OK((*ow)->Sync(3, false));
    ASSERT_OK((*ow)->Rollback(0, false));
  }
  EXPECT_EQ(vol_->InspectStaging(vf_, *other)->durable, 0u);
  ASSERT_OK(vol_->DiscardStaging(vf_, *other));
  EXPECT_ERROR(vol_->OpenStaging(vf_, *other), Code::kNotFound);
  // An abandoned session: kept while young, swept (with what it staged) once old enough.
  auto left = vol_->CreateStaging(vf_);
  ASSERT_OK(left);
  {
    auto lw = vol_->OpenStaging(vf_, *left);
    ASSERT_OK(lw);
    ASSERT_OK((*lw)->WriteAt(0, "left", 4, &written));
    ASSERT_OK((*lw)->Sync(4, false));
  }
  EXPECT_EQ(vol_->SweepStaging(vf_, std::chrono::seconds(3600), nullptr).removed, 0u);
  ASSERT_OK(vol_->OpenStaging(vf_, *left));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // older than the age below
  std::vector<std::string> swept;
  StagingSweep sw = vol_->SweepStaging(
      vf_, std::chrono::seconds(0),
      [&](const std::string&, const std::string&, const std::string& s) { swept.push_back(s); });
  EXPECT_EQ(sw.removed, 1u);
  EXPECT_EQ(sw.removed_bytes, 4u);
  EXPECT_EQ(swept, std::vector<std::string>{*left});
  EXPECT_ERROR(vol_->OpenStaging(vf_, *left), Code::kNotFound);
}

TEST_P(VolumeInterface, CopiesOfVFolders) {
  MakeVFolder();
  PutFile("d/e/f.txt", "content");
  auto dst = VFolderId::Parse(
                 "user:11111111111111111111111111111111/"
                 "00000000000000000000000000000002")
                 .value();
  ASSERT_OK(vol_->CreateVFolder(dst, 0755, true, std::nullopt));
  ASSERT_OK(vol_->CopyVFolderFrom(*vol_, vf_, dst, *vol_->GetFreshUsage(vf_)));
  EXPECT_EQ(ReadAll(**vol_->OpenReader(dst, "d/e/f.txt")), "content");
  ExpectUsage(Settled([&] { return vol_->GetUsage(dst)->used_bytes; }, 7), 7);
}

// S3 listings page through a tree in key order, in which a directory sorts as if followed by
// '/' (after "a-b" and "a.c", before "a0"), whatever order the backend lists in: a delimiter
// listing on an origin, readdir order sorted (and kept, for large directories), a kept listing.
TEST_P(VolumeInterface, ListingsPageInKeyOrder) {
  MakeVFolder();
  std::vector<std::string> files = {"a b",     "a!",   "a-b", "a.c",   "a0",  "a/x",  "a/y-1",
                                    "a/sub/q", "b-/z", "c",   "d/e/f", "d-e", "d.e/g"};
  for (const auto& f : files) PutFile(f, "k");
  ASSERT_OK(vol_->Mkdir(vf_, "b", false, false));  // empty: its marker "b/" is a key
  std::vector<std::string> keys = files;
  keys.push_back("b/");
  std::sort(keys.begin(), keys.end());
  int runs = 0;
  for (const char* prefix : {"", "a", "a/", "a-", "b", "d/e/", "zz"})
    for (const char* delim : {"", "/"})
      for (size_t page : {2, 1000})
        for (const char* after : {"", "a", "a/", "a/x", "a-b", "b/", "d/e/"})
          for (const char* end : {"", "c"}) {
            ListQuery q;
            q.prefix = prefix;
            q.delimiter = delim;
            q.after = after;
            if (*end) q.end = end;
            q.max_keys = page;
            q.want_etag = false;
            EXPECT_EQ(Paged(*vol_, vf_, q), ExpectedListing(keys, q))
                << "prefix '" << prefix << "' delimiter '" << delim << "' page " << page
                << " after '" << after << "' end '" << end << "'";
            ++runs;
          }
  EXPECT_EQ(runs, 392);
  // Behind the cache a listing is kept for its TTL whatever changes; an s3 volume lists in key
  // order on its origin (and writing a thousand objects takes a while).
  if (GetParam().wrap || GetParam().name == "s3") return;
  // A large directory: its sorted names are kept between pages, and a change to it is seen on
  // the next page.
  std::vector<std::string> many;
  for (size_t i = 0; i < KeyOrderCache::kMinNames + 100; ++i)
    many.push_back(fmt::format("big/n{:05}", (i * 7919) % (KeyOrderCache::kMinNames + 100)));
  for (const auto& k : many) PutFile(k, "");
  std::sort(many.begin(), many.end());
  KeyOrderCache names(size_t{64} << 20, std::chrono::milliseconds(0));
  ListQuery q;
  q.prefix = "big/";
  q.max_keys = 100;
  q.want_etag = false;
  EXPECT_EQ(Paged(*vol_, vf_, q, &names), many);
  EXPECT_GT(names.bytes(), 0u);
  // Past the file system's clock tick, so that the change moves the directory's times.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  PutFile("big/n00000a", "");
  many.insert(many.begin() + 1, "big/n00000a");
  EXPECT_EQ(Paged(*vol_, vf_, q, &names), many);
}

// Random trees below a directory of their own, listed by random queries in small pages:
// the oracle's listing on every backend (on s3, fewer: every file is a request to the origin).
TEST_P(VolumeInterface, RandomTreesPageLikeTheOracle) {
  MakeVFolder();
  std::mt19937 rng(1202);
  const int rounds = GetParam().name == "s3" ? 4 : 12;
  for (int round = 0; round < rounds; ++round) {
    const std::string root = fmt::format("r{:02}/", round);
    const auto keys = RandomTree(
        rng, root, 24, [&](const std::string& p) { PutFile(p, "k"); },
        [&](const std::string& p) { ASSERT_OK(vol_->Mkdir(vf_, p, true, false)); });
    for (int k = 0; k < 25; ++k) {
      const ListQuery q = RandomQuery(rng, keys, root);
      ASSERT_EQ(Paged(*vol_, vf_, q), ExpectedListing(keys, q))
          << "round " << round << ": " << Describe(q);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, VolumeInterface, ::testing::ValuesIn(AllBackends()),
                         BackendName);

}  // namespace
}  // namespace sluice::test
