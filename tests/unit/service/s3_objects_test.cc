// Split listing and bounded listing over the in-memory volume: whatever the estimate, the ranges
// partition the keys, and bounded listings of them, paged, give every key exactly once.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "service/s3/objects.h"
#include "support/assert_status.h"
#include "support/listing_oracle.h"
#include "volume/mem/mem_volume.h"
#include "volume/registry.h"

namespace sluice {
namespace {

class SplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    VolumeConfig c;
    c.name = "mem";
    c.backend = "mem";
    c.path = "mem";
    vol_ = std::make_unique<MemVolume>(c, 1 << 30);
    ASSERT_OK(vol_->CreateVFolder(vf_, 0755, true, std::nullopt));
  }
  void Put(const std::string& key) { ASSERT_OK(vol_->PutFile(vf_, key, "x")); }

  // Every key of the listing with `end` (and optionally a start), in pages of `page`.
  std::vector<std::string> ListRange(const KeyRange& r, const std::string& prefix, size_t page) {
    std::vector<std::string> keys;
    ListQuery q;
    q.prefix = prefix;
    q.after = r.start_after.value_or("");
    q.end = r.end_key;
    q.max_keys = page;
    q.want_etag = false;
    for (;;) {
      auto p = ListObjects(*vol_, vf_, q);
      EXPECT_OK(p);
      if (!p.ok()) break;
      for (const auto& it : p->items) keys.push_back(it.object.key);
      if (!p->truncated) break;
      q.after = p->items.back().object.key;
    }
    return keys;
  }

  std::vector<std::string> All(const std::string& prefix) {
    return ListRange(KeyRange{}, prefix, 1000);
  }

  // Asserts that the ranges of `s` cover `prefix`'s keys once each, in order; returns the
  // number of keys in each range.
  std::vector<size_t> CheckPartition(const SplitResult& s, const std::string& prefix,
                                     size_t page = 7) {
    std::vector<std::string> joined;
    std::vector<size_t> counts;
    for (size_t i = 0; i < s.ranges.size(); ++i) {
      const KeyRange& r = s.ranges[i];
      EXPECT_EQ(r.start_after.has_value(), i > 0);
      EXPECT_EQ(r.end_key.has_value(), i + 1 < s.ranges.size());
      if (i > 0) {
        EXPECT_EQ(*r.start_after, *s.ranges[i - 1].end_key);
      }
      auto keys = ListRange(r, prefix, page);
      counts.push_back(keys.size());
      joined.insert(joined.end(), keys.begin(), keys.end());
    }
    EXPECT_EQ(joined, All(prefix));
    return counts;
  }

  std::unique_ptr<MemVolume> vol_;
  VFolderId vf_ =
      VFolderId::Parse("user:11111111111111111111111111111111/abcdef0123456789abcdef0123456789")
          .value();
};

TEST_F(SplitTest, FlatDirectorySplitsExactlyByCount) {
  for (int i = 0; i < 1000; ++i) Put(fmt::format("flat/k{:04d}", i));
  Put("other");
  SplitQuery q;
  q.prefix = "flat/";
  q.parts = 4;
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_TRUE(s->exact);
  EXPECT_EQ(s->estimated, 1000u);
  ASSERT_EQ(s->ranges.size(), 4u);
  EXPECT_EQ(CheckPartition(*s, "flat/"), (std::vector<size_t>{250, 250, 250, 250}));
  for (const auto& r : s->ranges) EXPECT_EQ(r.estimated, 250u);
}

TEST_F(SplitTest, NestedTreeWithinBudgetIsExact) {
  // Keys in byte order are not the order of a tree walk: "a-b" < "a/b" < "a0".
  for (int d = 0; d < 10; ++d)
    for (int f = 0; f < 30; ++f) Put(fmt::format("ds/c{}/img{:03d}", d, f));
  Put("ds/c1-x");
  Put("ds/c10");
  ASSERT_OK(vol_->Mkdir(vf_, "ds/empty", true, true));
  SplitQuery q;
  q.prefix = "ds/";
  q.parts = 5;
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_TRUE(s->exact);
  EXPECT_EQ(s->estimated, 303u);  // 300 images, two files, one empty directory's marker
  auto counts = CheckPartition(*s, "ds/");
  ASSERT_EQ(counts.size(), 5u);
  for (size_t c : counts) EXPECT_NEAR(static_cast<double>(c), 303.0 / 5, 1.5);
}

TEST_F(SplitTest, PastTheBudgetDirectoriesAreEstimatedNotWalked) {
  for (int d = 0; d < 20; ++d)
    for (int f = 0; f < 50; ++f) Put(fmt::format("c{:02d}/f{:02d}", d, f));
  SplitQuery q;
  q.parts = 4;
  q.budget = 20 + 5 * 50;  // spent after five class directories; a depth reads eight
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_FALSE(s->exact);
  EXPECT_EQ(s->estimated, 1000u);  // the twelve not read hold what the eight read did
  auto counts = CheckPartition(*s, "");
  ASSERT_EQ(counts.size(), 4u);
  for (size_t c : counts) EXPECT_NEAR(static_cast<double>(c), 250.0, 50.0);
}

TEST_F(SplitTest, TheDefaultBudgetGrowsWithTheParts) {
  // 30 directories of 600 keys: two parts read about 8192 names (the least budget) and
  // estimate the rest; a hundred parts read every name.
  for (int d = 0; d < 30; ++d)
    for (int f = 0; f < 600; ++f) Put(fmt::format("k/d{:02d}/f{:03d}", d, f));
  EXPECT_EQ(SplitBudget(2), 8192u);
  EXPECT_EQ(SplitBudget(8), 16384u);
  EXPECT_EQ(SplitBudget(1000), 200000u);
  SplitQuery q;
  q.parts = 2;
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_FALSE(s->exact);
  EXPECT_EQ(s->estimated, 18000u);
  auto counts = CheckPartition(*s, "");
  ASSERT_EQ(counts.size(), 2u);
  for (size_t c : counts) EXPECT_NEAR(static_cast<double>(c), 9000.0, 600.0);  // a directory
  q.parts = 100;
  s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_TRUE(s->exact);
  EXPECT_EQ(CheckPartition(*s, "").size(), 100u);
}

// A flat directory larger than the budget is counted whole but held as a sample: the split
// keeps about the budget's names, not one per key (before, all 40,000), and its cuts still
// balance, whatever order the backend lists names in (key order here, the worst for a split
// that kept only the first names it read).
TEST_F(SplitTest, AFlatDirectoryPastTheBudgetIsSampled) {
  for (int i = 0; i < 40000; ++i) Put(fmt::format("flat/k{:05d}", i));
  SplitQuery q;
  q.prefix = "flat/";
  q.parts = 4;
  q.budget = 2000;
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_FALSE(s->exact);
  EXPECT_EQ(s->estimated, 40000u);  // every name counted
  EXPECT_LE(s->names_kept, 2 * q.budget);
  auto counts = CheckPartition(*s, "flat/", 1000);
  ASSERT_EQ(counts.size(), 4u);
  uint64_t sum = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_NEAR(static_cast<double>(counts[i]), 10000.0, 1500.0) << "range " << i;
    EXPECT_NEAR(static_cast<double>(s->ranges[i].estimated), double(counts[i]), 1500.0);
    sum += s->ranges[i].estimated;
  }
  EXPECT_NEAR(double(sum), 40000.0, 4.0);
}

// The same for a directory of many directories: a sample of them is read or estimated, each
// standing for its share.
TEST_F(SplitTest, ADirectoryOfManyDirectoriesIsSampled) {
  for (int d = 0; d < 3000; ++d)
    for (int f = 0; f < 3; ++f) Put(fmt::format("d{:04d}/f{}", d, f));
  SplitQuery q;
  q.parts = 3;
  q.budget = 1000;
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_FALSE(s->exact);
  EXPECT_NEAR(double(s->estimated), 9000.0, 900.0);
  EXPECT_LE(s->names_kept, 2 * q.budget);
  auto counts = CheckPartition(*s, "", 1000);
  ASSERT_EQ(counts.size(), 3u);
  for (size_t c : counts) EXPECT_NEAR(static_cast<double>(c), 3000.0, 600.0);
}

TEST_F(SplitTest, FewerKeysThanPartsAndNoKeys) {
  Put("a");
  Put("b");
  SplitQuery q;
  q.parts = 8;
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_LE(s->ranges.size(), 3u);
  CheckPartition(*s, "");
  q.prefix = "missing/";
  s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  ASSERT_EQ(s->ranges.size(), 1u);
  EXPECT_EQ(s->estimated, 0u);
}

// More parts than keys, with directories estimated rather than read: a range that ends after
// one ends at the first name past its subtree ("c05/" -> "c050"), and a file of that very name
// is that range's, not a range of its own from "c050" to "c050" (empty, and counted there).
TEST_F(SplitTest, AFileNamedWhereAnEstimatedDirectoryEndsIsNotARangeOfItsOwn) {
  for (int d = 0; d < 20; ++d) {
    for (int f = 0; f < 50; ++f) Put(fmt::format("c{:02d}/f{:02d}", d, f));
    Put(fmt::format("c{:02d}0", d));
  }
  SplitQuery q;
  q.parts = 4000;
  q.budget = 40 + 5 * 50;  // some class directories are estimated, not read
  auto s = SplitKeys(*vol_, vf_, q);
  ASSERT_OK(s);
  EXPECT_FALSE(s->exact);
  CheckPartition(*s, "", 1000);
  for (size_t i = 0; i < s->ranges.size(); ++i) {
    const KeyRange& r = s->ranges[i];
    EXPECT_FALSE(r.start_after && r.end_key && *r.start_after >= *r.end_key)
        << "range " << i << " (" << *r.start_after << ", " << *r.end_key << "]";
  }
}

TEST_F(SplitTest, BoundedListingStopsAtItsEndWithPrefixes) {
  for (const char* k : {"a/1", "a/2", "b/1", "c", "d/1"}) Put(k);
  ListQuery q;
  q.delimiter = "/";
  q.end = "c";
  auto p = ListObjects(*vol_, vf_, q);
  ASSERT_OK(p);
  std::vector<std::string> keys;
  for (const auto& it : p->items) keys.push_back(it.object.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a/", "b/", "c"}));
  EXPECT_FALSE(p->truncated);
}

// Random trees listed by random queries in pages of one to four keys, from the vfolder's root:
// what paging gives is the oracle's listing, key for key (names read in any order and sorted
// per directory, pages resuming in the middle of directories at any depth). The interface
// suite does the same below a directory on every backend.
TEST(ListingDifferential, RandomTreesPageLikeTheOracle) {
  std::mt19937 rng(20261202);
  int queries = 0;
  for (int round = 0; round < 60; ++round) {
    VolumeConfig c;
    c.name = "mem";
    c.backend = "mem";
    c.path = "mem";
    MemVolume vol(c, 1 << 30);
    const auto vf = VFolderId::Parse(
                        "user:11111111111111111111111111111111/"
                        "abcdef0123456789abcdef0123456789")
                        .value();
    ASSERT_OK(vol.CreateVFolder(vf, 0755, true, std::nullopt));
    const auto keys = test::RandomTree(
        rng, "", 30, [&](const std::string& p) { ASSERT_OK(vol.PutFile(vf, p, "k")); },
        [&](const std::string& p) { ASSERT_OK(vol.Mkdir(vf, p, true, false)); });
    for (int k = 0; k < 40; ++k) {
      const ListQuery q = test::RandomQuery(rng, keys, "");
      ASSERT_EQ(test::Paged(vol, vf, q), test::ExpectedListing(keys, q))
          << "round " << round << ": " << test::Describe(q);
      ++queries;
    }
  }
  EXPECT_EQ(queries, 2400);
}

// A vfs volume "test" in a temporary directory with one vfolder `vf` (multipart records are
// extended attributes, which the in-memory volume does not keep), removed at the end.
class VfsObjects : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/sluice-objects-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    base_ = tmpl;
    VolumeConfig cfg;
    cfg.name = "test";
    cfg.backend = "vfs";
    cfg.path = base_;
    auto made = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{&pool_});
    ASSERT_OK(made);
    vol_ = std::move(made).value();
    ASSERT_OK(vol_->Init());
    ASSERT_OK(vol_->CreateVFolder(vf, 0755, true, std::nullopt));
  }
  void TearDown() override {
    vol_.reset();
    std::filesystem::remove_all(base_);
  }
  const VFolderId vf =
      VFolderId::Parse("user:11111111111111111111111111111111/abcdef0123456789abcdef0123456789")
          .value();
  ThreadPool pool_{"scan", 2};
  std::string base_;
  std::unique_ptr<Volume> vol_;
};

// Complete ends an upload with the removal of its record (NoSuchUpload at once, to every node),
// the object published; its parts go after (here: no background pool, before it answers). A
// Complete whose part removal a crash cut short leaves parts without a record: the sweep takes
// them once old enough, and leaves uploads in progress alone.
TEST_F(VfsObjects, CompletedUploadsEndAtOnceAndTheSweepTakesWhatTheyLeave) {
  auto& vol = *vol_;
  QuotaReservations reservations;
  ObjectStore store(&reservations);
  std::vector<UploadedPart> parts;
  auto part = [&](const MultipartUpload& u, int n, const std::string& data) {
    auto w = store.BeginPart(vol, vf, u, n, data.size(), false);
    ASSERT_OK(w);
    ASSERT_OK((*w)->Write(data.data(), data.size()));
    ASSERT_OK((*w)->Publish(ObjectMeta{}, false));
  };
  auto done = store.CreateMultipart(vol, vf, "big", {});
  ASSERT_OK(done);
  part(*done, 1, std::string(5 << 20, 'a'));
  part(*done, 2, "world");
  auto listed = store.ListParts(vol, vf, *done);
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 2u);
  ASSERT_OK(store.CompleteMultipart(vol, vf, *done, *listed, {}, false));
  EXPECT_ERROR(store.GetMultipart(vol, vf, done->id), Code::kNotFound);
  EXPECT_ERROR(store.ListParts(vol, vf, *done), Code::kNotFound);
  auto o = store.Open(vol, vf, "big");
  ASSERT_OK(o);
  EXPECT_EQ(o->entry.size, (5u << 20) + 5);
  auto dir_of = [](const MultipartUpload& u) {
    return std::string(kStagingDirName) + "/mp-" + u.id;
  };
  EXPECT_ERROR(vol.Stat(vf, dir_of(*done)), Code::kNotFound);

  // What a crash between the record's removal and the parts' leaves, beside an upload in
  // progress.
  auto left = store.CreateMultipart(vol, vf, "other", {});
  ASSERT_OK(left);
  part(*left, 1, "x");
  ASSERT_OK(vol.DeleteFiles(vf, {dir_of(*left) + "/upload"}, false));
  auto live = store.CreateMultipart(vol, vf, "third", {});
  ASSERT_OK(live);
  part(*live, 1, "y");
  // Younger than an hour: kept, and nothing is abandoned yet.
  EXPECT_EQ(store.SweepMultipart(vol, vf, std::chrono::hours(24)), 0u);
  ASSERT_OK(vol.Stat(vf, dir_of(*left)));
  // An hour old: the leftover goes; the upload in progress (24 hours to live) stays.
  auto hour_ago = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now()) - 3601;
  const std::string left_path = vol.MountPath(vf, "").value() + "/" + dir_of(*left);
  struct timespec times[2] = {{hour_ago, 0}, {hour_ago, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, left_path.c_str(), times, 0), 0) << left_path;
  EXPECT_EQ(store.SweepMultipart(vol, vf, std::chrono::hours(24)), 0u);
  EXPECT_ERROR(vol.Stat(vf, dir_of(*left)), Code::kNotFound);
  ASSERT_OK(store.GetMultipart(vol, vf, live->id));
  ASSERT_OK(vol.Stat(vf, dir_of(*live)));

  // One request ends an upload: while another is ending it (its record claimed, as a Complete
  // does first), an Abort or a second Complete is NoSuchUpload and leaves the parts alone.
  // Before, an Abort answered 204 while the Complete went on to publish the object.
  auto raced = store.CreateMultipart(vol, vf, "raced", {});
  ASSERT_OK(raced);
  part(*raced, 1, "r");
  const std::string rec = dir_of(*raced) + "/upload";
  ASSERT_OK(vol.Rename(vf, rec, "ending"));  // another request's claim
  EXPECT_ERROR(store.AbortMultipart(vol, vf, *raced), Code::kNotFound);
  auto raced_parts = std::vector<UploadedPart>{};
  EXPECT_ERROR(store.CompleteMultipart(vol, vf, *raced, raced_parts, {}, false), Code::kNotFound);
  ASSERT_OK(vol.Stat(vf, dir_of(*raced) + "/p00001"));
  ASSERT_OK(vol.Rename(vf, dir_of(*raced) + "/ending", "upload"));  // it gave up
  // A Complete that fails (a part listed that is not there) gives the upload back.
  auto wrong = *store.ListParts(vol, vf, *raced);
  wrong[0].number = 7;
  EXPECT_FALSE(store.CompleteMultipart(vol, vf, *raced, wrong, {}, false).ok());
  ASSERT_OK(store.GetMultipart(vol, vf, raced->id));
  ASSERT_OK(store.AbortMultipart(vol, vf, *raced));
  EXPECT_ERROR(store.GetMultipart(vol, vf, raced->id), Code::kNotFound);

  // A part that lands while another request ends the upload (its record "ending") stays:
  // the upload may be given back (a Complete that fails), and then holds the part its client
  // was told it has. Before, the part removed itself and its client heard NoSuchUpload.
  auto during = store.CreateMultipart(vol, vf, "during", {});
  ASSERT_OK(during);
  part(*during, 1, "one");
  auto dw = store.BeginPart(vol, vf, *during, 2, 3, false);
  ASSERT_OK(dw);
  ASSERT_OK((*dw)->Write("two", 3));
  ASSERT_OK(vol.Rename(vf, dir_of(*during) + "/upload", "ending"));  // a Complete's claim
  ASSERT_OK((*dw)->Publish(ObjectMeta{}, false));
  ASSERT_OK(vol.Rename(vf, dir_of(*during) + "/ending", "upload"));  // it gave the upload back
  auto during_parts = store.ListParts(vol, vf, *during);
  ASSERT_OK(during_parts);
  EXPECT_EQ(during_parts->size(), 2u);
  ASSERT_OK(store.AbortMultipart(vol, vf, *during));

  // A part that lands after its upload ended is taken back (it made the upload's directory
  // again, where its bytes counted until the hourly sweep).
  auto late = store.CreateMultipart(vol, vf, "late", {});
  ASSERT_OK(late);
  auto lw = store.BeginPart(vol, vf, *late, 1, 4, false);
  ASSERT_OK(lw);
  ASSERT_OK((*lw)->Write("late", 4));
  ASSERT_OK(store.AbortMultipart(vol, vf, *late));
  EXPECT_ERROR((*lw)->Publish(ObjectMeta{}, false), Code::kNotFound);
  EXPECT_ERROR(vol.Stat(vf, dir_of(*late)), Code::kNotFound);

  // A key that is not UTF-8 (a plain PUT takes it) is kept in the upload's record byte for
  // byte; before, its JSON record threw.
  const std::string raw_key = "caf\xe9/\xff";
  auto odd = store.CreateMultipart(vol, vf, raw_key, {});
  ASSERT_OK(odd);
  auto again = store.GetMultipart(vol, vf, odd->id);
  ASSERT_OK(again);
  EXPECT_EQ(again->key, raw_key);
  part(*odd, 1, "z");
  auto odd_parts = store.ListParts(vol, vf, *odd);
  ASSERT_OK(odd_parts);
  ASSERT_OK(store.CompleteMultipart(vol, vf, *odd, *odd_parts, {}, false));
  auto odd_object = store.Open(vol, vf, raw_key);
  ASSERT_OK(odd_object);
  EXPECT_EQ(odd_object->entry.size, 1u);
}

// A Complete cut short by a crash leaves its claim (the record renamed "ending") behind. While
// the claim is within its lease the upload is being ended: NoSuchUpload, and the sweep keeps its
// parts however old the directory. Once the lease has passed without a sign of life, the upload
// is given back: the client's retried Complete completes it. Before 2026-12-07 it answered
// NoSuchUpload for good, and the sweep removed the parts an hour later.
TEST_F(VfsObjects, ACompleteCutShortGivesTheUploadBackOnceItsClaimLapses) {
  auto& vol = *vol_;
  QuotaReservations reservations;
  ObjectStore store(&reservations);
  store.SetClaimLease(std::chrono::milliseconds(1500));
  auto u = store.CreateMultipart(vol, vf, "cut", {});
  ASSERT_OK(u);
  const std::string first(5 << 20, 'a');
  for (int n = 1; n <= 2; ++n) {
    auto w = store.BeginPart(vol, vf, *u, n, n == 1 ? first.size() : 4, false);
    ASSERT_OK(w);
    ASSERT_OK(n == 1 ? (*w)->Write(first.data(), first.size()) : (*w)->Write("tail", 4));
    ASSERT_OK((*w)->Publish(ObjectMeta{}, false));
  }
  auto parts = store.ListParts(vol, vf, *u);
  ASSERT_OK(parts);
  const std::string dir = std::string(kStagingDirName) + "/mp-" + u->id;
  ASSERT_OK(vol.Rename(vf, dir + "/upload", "ending"));  // claimed, then the node went down
  EXPECT_ERROR(store.CompleteMultipart(vol, vf, *u, *parts, {}, false), Code::kNotFound);
  // An hour-old directory with a live claim: not a completed upload's leftovers.
  auto hour_ago = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now()) - 3601;
  const std::string path = vol.MountPath(vf, "").value() + "/" + dir;
  struct timespec times[2] = {{hour_ago, 0}, {hour_ago, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
  EXPECT_EQ(store.SweepMultipart(vol, vf, std::chrono::hours(24)), 0u);
  ASSERT_OK(vol.Stat(vf, dir + "/p00001"));
  std::this_thread::sleep_for(std::chrono::milliseconds(1700));
  auto back = store.GetMultipart(vol, vf, u->id);  // the retry's lookup gives it back
  ASSERT_OK(back);
  auto again = store.ListParts(vol, vf, *back);
  ASSERT_OK(again);
  EXPECT_EQ(again->size(), 2u);
  ASSERT_OK(store.CompleteMultipart(vol, vf, *back, *again, {}, false));
  auto o = store.Open(vol, vf, "cut");
  ASSERT_OK(o);
  EXPECT_EQ(o->entry.size, first.size() + 4);
  EXPECT_ERROR(store.GetMultipart(vol, vf, u->id), Code::kNotFound);
}

// An S3 write's reservation is what is still to come: the bytes it wrote are in the scope's
// usage already. Before, they stayed reserved too, so a body of unknown length (chunked, no
// declared size) was refused once about half its room was written.
TEST_F(VfsObjects, WrittenBytesAreNotReservedTwice) {
  auto& vol = *vol_;
  ASSERT_OK(vol.quota().UpdateScope(*vf.scope, 20ULL << 20));
  QuotaReservations reservations;
  ObjectStore store(&reservations);
  const std::string scope = QuotaReservations::ScopeKey("test", vf.scope->hex);
  auto w = store.BeginPut(vol, vf, "big", std::nullopt, false);
  ASSERT_OK(w);
  const std::string piece(1 << 20, 'x');
  for (int i = 0; i < 14; ++i) ASSERT_OK((*w)->Write(piece.data(), piece.size())) << "MiB " << i;
  EXPECT_LE(reservations.Reserved(scope), 8u << 20);  // what is still to come, not all of it
  ASSERT_OK((*w)->Publish(ObjectMeta{}, false));
  EXPECT_EQ(reservations.Reserved(scope), 0u);
  // Near the limit a small body still fits (6 MiB left: less than a step of 8), and past it a
  // write is refused.
  auto more = store.BeginPut(vol, vf, "more", std::nullopt, false);
  ASSERT_OK(more);
  Status st;
  int fitted = 0;
  for (; fitted < 10 && st.ok(); ++fitted) st = (*more)->Write(piece.data(), piece.size());
  EXPECT_EQ(st.code(), Code::kQuotaExceeded) << st.ToString();
  EXPECT_GE(fitted, 5);
}

// On a volume that copies parts (vfs), Complete holds them twice until they go: the copy is
// reserved, refused where the scope has no room for it (the upload is given back), and the
// reservation is gone once the object is published.
// A part replaced between the listing Complete was given and its read (an UploadPart that
// began before the Complete, of the same size): the Complete refuses (kConflict, the upload
// given back) rather than publish the new bytes under an ETag made of the old part's MD5.
TEST_F(VfsObjects, APartReplacedWhileCompletingIsRefused) {
  auto& vol = *vol_;
  QuotaReservations reservations;
  ObjectStore store(&reservations);
  auto u = store.CreateMultipart(vol, vf, "obj", {});
  ASSERT_OK(u);
  auto part = [&](int n, const std::string& data) {
    auto w = store.BeginPart(vol, vf, *u, n, data.size(), false);
    ASSERT_OK(w);
    ASSERT_OK((*w)->Write(data.data(), data.size()));
    ASSERT_OK((*w)->Publish(ObjectMeta{}, false));
  };
  part(1, std::string(5 << 20, 'a'));
  part(2, "tail");
  auto listed = store.ListParts(vol, vf, *u);
  ASSERT_OK(listed);
  part(1, std::string(5 << 20, 'b'));  // same size, other bytes
  EXPECT_ERROR(store.CompleteMultipart(vol, vf, *u, *listed, {}, false), Code::kConflict);
  EXPECT_ERROR(store.Open(vol, vf, "obj"), Code::kNotFound);
  ASSERT_OK(store.GetMultipart(vol, vf, u->id));  // given back: listed again, it completes
  auto again = store.ListParts(vol, vf, *u);
  ASSERT_OK(again);
  auto etag = store.CompleteMultipart(vol, vf, *u, *again, {}, false);
  ASSERT_OK(etag);
  std::vector<std::string> md5s;
  for (const auto& p : *again) md5s.push_back(p.md5);
  EXPECT_EQ(*etag, MultipartETag(md5s));
  auto o = store.Open(vol, vf, "obj");
  ASSERT_OK(o);
  char c = 0;
  ASSERT_OK(o->file->ReadAt(0, &c, 1));
  EXPECT_EQ(c, 'b');
}

TEST_F(VfsObjects, CompleteReservesTheCopyOfItsParts) {
  auto& vol = *vol_;
  QuotaReservations reservations;
  ObjectStore store(&reservations);
  const std::string scope = QuotaReservations::ScopeKey("test", vf.scope->hex);
  auto u = store.CreateMultipart(vol, vf, "big", {});
  ASSERT_OK(u);
  const std::string data(6 << 20, 'p');
  for (int n = 1; n <= 2; ++n) {
    auto w = store.BeginPart(vol, vf, *u, n, data.size(), false);
    ASSERT_OK(w);
    ASSERT_OK((*w)->Write(data.data(), data.size()));
    ASSERT_OK((*w)->Publish(ObjectMeta{}, false));
  }
  auto parts = store.ListParts(vol, vf, *u);
  ASSERT_OK(parts);
  ASSERT_EQ(parts->size(), 2u);
  ASSERT_OK(vol.quota().UpdateScope(*vf.scope, 20ULL << 20));  // 12 MiB of parts, 8 left
  auto refused = store.CompleteMultipart(vol, vf, *u, *parts, {}, false);
  ASSERT_EQ(refused.status().code(), Code::kQuotaExceeded) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("copies its parts"), std::string::npos);
  EXPECT_EQ(reservations.Reserved(scope), 0u);
  EXPECT_ERROR(store.Open(vol, vf, "big"), Code::kNotFound);
  ASSERT_OK(store.GetMultipart(vol, vf, u->id));  // given back
  ASSERT_OK(vol.quota().UpdateScope(*vf.scope, 30ULL << 20));
  ASSERT_OK(store.CompleteMultipart(vol, vf, *u, *parts, {}, false));
  EXPECT_EQ(reservations.Reserved(scope), 0u);
  auto o = store.Open(vol, vf, "big");
  ASSERT_OK(o);
  EXPECT_EQ(o->entry.size, 12u << 20);
}

// The metadata cache answers for a file version only: its size, mtime and ctime (and entity
// tag, where the backend has one) must be those it was kept with; files of another volume,
// vfolder or device with the same inode are other files; and past its capacity it keeps
// working, forgetting some entries rather than mixing them up.
TEST(ObjectMetaCache, AnswersForTheVersionKeptOnly) {
  ObjectMetaCache cache(1 << 10);
  int a = 0, b = 0;  // two volumes: only their addresses matter
  auto* va = reinterpret_cast<const Volume*>(&a);
  auto* vb = reinterpret_cast<const Volume*>(&b);
  VFolderId vf{std::nullopt, std::string(32, 'a')}, other_vf{std::nullopt, std::string(32, 'b')};
  auto entry = [](uint64_t ino, uint64_t size) {
    DirEntry e;
    e.ino = ino;
    e.size = size;
    e.modified = std::chrono::system_clock::time_point(std::chrono::seconds(1000 + ino));
    e.changed = std::chrono::system_clock::time_point(std::chrono::seconds(2000 + ino));
    return e;
  };
  auto meta = [](const std::string& etag) {
    ObjectMeta m;
    m.etag = etag;
    return m;
  };
  EXPECT_FALSE(cache.Find(va, vf, entry(7, 10)));
  cache.Put(va, vf, entry(7, 10), meta("seven"));
  cache.Put(va, vf, entry(8, 10), std::nullopt);  // a file without metadata
  auto hit = cache.Find(va, vf, entry(7, 10));
  ASSERT_TRUE(hit && *hit);
  EXPECT_EQ((*hit)->etag, "seven");
  hit = cache.Find(va, vf, entry(8, 10));
  ASSERT_TRUE(hit);
  EXPECT_EQ(*hit, nullptr);
  EXPECT_FALSE(cache.Find(vb, vf, entry(7, 10)));  // another volume's inode 7
  EXPECT_FALSE(cache.Find(va, vf, entry(7, 11)));  // another size
  // Another vfolder's inode 7, and another device's (btrfs: each vfolder a subvolume, whose
  // first files have the same inode numbers as those of the others), with the same times.
  EXPECT_FALSE(cache.Find(va, other_vf, entry(7, 10)));
  DirEntry elsewhere = entry(7, 10);
  elsewhere.dev = 42;
  EXPECT_FALSE(cache.Find(va, vf, elsewhere));
  cache.Put(va, vf, elsewhere, meta("seven on 42"));
  cache.Put(va, other_vf, entry(7, 10), meta("seven of b"));
  EXPECT_EQ((*cache.Find(va, vf, elsewhere))->etag, "seven on 42");
  EXPECT_EQ((*cache.Find(va, other_vf, entry(7, 10)))->etag, "seven of b");
  EXPECT_EQ((*cache.Find(va, vf, entry(7, 10)))->etag, "seven");
  // An origin's object (no ctime of its own: an s3 volume gives it its mtime) replaced by one
  // of the same size in the same second: only its entity tag tells them apart.
  DirEntry remote = entry(70, 10);
  remote.etag = "e1";
  cache.Put(va, vf, remote, meta("remote"));
  EXPECT_TRUE(cache.Find(va, vf, remote));
  remote.etag = "e2";
  EXPECT_FALSE(cache.Find(va, vf, remote));
  DirEntry touched = entry(7, 10);
  touched.changed += std::chrono::nanoseconds(1);  // an attribute written since
  EXPECT_FALSE(cache.Find(va, vf, touched));
  touched = entry(7, 10);
  touched.modified -= std::chrono::seconds(1);
  EXPECT_FALSE(cache.Find(va, vf, touched));
  cache.Put(va, vf, entry(7, 11), meta("seven again"));  // the new version replaces the old
  EXPECT_EQ((*cache.Find(va, vf, entry(7, 11)))->etag, "seven again");
  EXPECT_FALSE(cache.Find(va, vf, entry(7, 10)));
  // Inode 0 (a backend without inodes) and a file without ctime are never kept.
  cache.Put(va, vf, entry(0, 1), meta("zero"));
  EXPECT_FALSE(cache.Find(va, vf, entry(0, 1)));
  DirEntry no_ctime = entry(9, 1);
  no_ctime.changed = {};
  cache.Put(va, vf, no_ctime, meta("nine"));
  EXPECT_FALSE(cache.Find(va, vf, no_ctime));
  // Twenty times its capacity: whatever it still answers is right, and it answers most of
  // the last entries put.
  for (uint64_t ino = 100; ino < 100 + 20 * 1024; ++ino)
    cache.Put(ino % 2 ? va : vb, vf, entry(ino, ino), meta(std::to_string(ino)));
  size_t recent = 0;
  for (uint64_t ino = 100; ino < 100 + 20 * 1024; ++ino) {
    auto h = cache.Find(ino % 2 ? va : vb, vf, entry(ino, ino));
    if (h) {
      EXPECT_EQ((*h)->etag, std::to_string(ino));
    }
    EXPECT_FALSE(cache.Find(ino % 2 ? vb : va, vf, entry(ino, ino)));
    if (h && ino >= 100 + 20 * 1024 - 256) ++recent;
  }
  EXPECT_GE(recent, 160u);
  // A cache of 4 slots a shard: another volume's key of the same inode shares its slots
  // whenever it falls in the same shard, and still must not be taken for it.
  ObjectMetaCache tiny(1);
  for (uint64_t ino = 1; ino <= 256; ++ino) {
    tiny.Put(va, vf, entry(ino, 1), meta("a"));
    EXPECT_FALSE(tiny.Find(vb, vf, entry(ino, 1))) << ino;
    ASSERT_TRUE(tiny.Find(va, vf, entry(ino, 1))) << ino;
  }
}

}  // namespace
}  // namespace sluice
