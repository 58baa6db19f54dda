// Maintained usage (volume/usage_tracker.h) and the vfs backend that uses it.
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "volume/usage_tracker.h"
#include "volume/vfs/vfs_volume.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A tree whose walks are counted and can be held at a gate.
struct FakeTree {
  std::atomic<uint64_t> bytes{0}, entries{0};
  std::atomic<int> walks{0};
  std::atomic<bool> hold{false};
  std::atomic<bool> in_walk{false};
  UsageTracker::ScanFn fn() {
    return [this](const std::string& path) -> Result<TreeUsage> {
      ++walks;
      in_walk = true;
      TreeUsage u{entries.load(), bytes.load(), std::nullopt};  // read at the walk's start
      while (hold) std::this_thread::sleep_for(1ms);
      in_walk = false;
      if (path == "/missing") return Status(Code::kNotFound, "no such tree");
      return u;
    };
  }
};

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit = 5s) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

TEST(UsageTracker, FirstReadWalksLaterReadsDoNot) {
  FakeTree tree;
  tree.bytes = 100;
  tree.entries = 3;
  UsageTracker t(tree.fn(), 1h);
  auto u = t.Get("/t");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->used_bytes, 100u);
  EXPECT_EQ(u->file_count, 3u);
  ASSERT_TRUE(u->measured_at.has_value());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t.Get("/t").ok());
  EXPECT_EQ(tree.walks, 1);
  // A failed first walk is an error and keeps nothing.
  EXPECT_EQ(t.Get("/missing").status().code(), Code::kNotFound);
  EXPECT_EQ(t.Get("/missing").status().code(), Code::kNotFound);
  EXPECT_EQ(tree.walks, 3);
}

TEST(UsageTracker, ConcurrentFirstReadsShareOneWalk) {
  FakeTree tree;
  tree.bytes = 7;
  tree.hold = true;
  UsageTracker t(tree.fn(), 1h);
  std::vector<std::thread> readers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    readers.emplace_back([&] {
      auto u = t.Get("/t");
      if (u.ok() && u->used_bytes == 7) ++ok;
    });
  ASSERT_TRUE(WaitFor([&] { return tree.in_walk.load(); }));
  std::this_thread::sleep_for(20ms);
  tree.hold = false;
  for (auto& r : readers) r.join();
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(tree.walks, 1);
}

TEST(UsageTracker, WritesThroughSluiceAdjustTheFigureWithoutAWalk) {
  FakeTree tree;
  tree.bytes = 1000;
  tree.entries = 10;
  UsageTracker t(tree.fn(), 1h);
  t.Add("/t", 500, 1);  // unknown yet: the first walk will see it
  ASSERT_EQ(t.Get("/t")->used_bytes, 1000u);
  t.Add("/t", 500, 1);
  t.Add("/t", -200, -2);
  auto u = t.Get("/t");
  EXPECT_EQ(u->used_bytes, 1300u);
  EXPECT_EQ(u->file_count, 9u);
  t.Add("/t", -1'000'000, -100);  // never below zero
  EXPECT_EQ(t.Get("/t")->used_bytes, 0u);
  EXPECT_EQ(tree.walks, 1);
}

TEST(UsageTracker, WritesDuringAWalkAreNotLost) {
  FakeTree tree;
  tree.bytes = 1000;
  UsageTracker t(tree.fn(), 1h);
  ASSERT_TRUE(t.Get("/t").ok());
  tree.hold = true;
  std::thread walker([&] { (void)t.Reconcile("/t"); });
  ASSERT_TRUE(WaitFor([&] { return tree.in_walk.load(); }));
  // The walk read 1000 at its start; this write lands after and must still count.
  t.Add("/t", 300, 1);
  tree.hold = false;
  walker.join();
  EXPECT_EQ(t.Get("/t")->used_bytes, 1300u);
}

TEST(UsageTracker, StaleFiguresAreReconciledInTheBackground) {
  FakeTree tree;
  tree.bytes = 10;
  UsageTracker t(tree.fn(), 50ms);
  ASSERT_EQ(t.Get("/t")->used_bytes, 10u);
  tree.bytes = 20;  // changed behind Sluice's back
  // Reads never wait: they get the known figure, with its age, and start a walk.
  EXPECT_TRUE(WaitFor([&] { return t.Get("/t")->used_bytes == 20u; }));
  auto u = t.Get("/t");
  EXPECT_LT(std::chrono::system_clock::now() - *u->measured_at, 1s);
  // The periodic sweep re-walks a vfolder in use even when nobody reads it.
  t.Add("/t", 1, 0);
  int walks = tree.walks;
  tree.bytes = 40;
  EXPECT_TRUE(WaitFor([&] { return tree.walks > walks; }));
  EXPECT_TRUE(WaitFor([&] { return t.Get("/t")->used_bytes >= 40u; }));
}

TEST(UsageTracker, SmallTreesAreWalkedOnEveryRead) {
  FakeTree tree;
  tree.bytes = 5;
  UsageTracker t(tree.fn(), 1h, 1s);  // every walk of the fake tree is well within budget
  ASSERT_EQ(t.Get("/t")->used_bytes, 5u);
  tree.bytes = 6;  // behind Sluice's back
  EXPECT_EQ(t.Get("/t")->used_bytes, 6u);
  EXPECT_EQ(tree.walks, 2);
  // A tree whose walk costs more than the budget keeps its maintained figure.
  UsageTracker slow(
      [](const std::string&) -> Result<TreeUsage> {
        std::this_thread::sleep_for(5ms);
        return TreeUsage{1, 1, std::nullopt};
      },
      1h, 1ms);
  auto first = slow.Get("/t");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*slow.Get("/t")->measured_at, *first->measured_at);
}

TEST(UsageTracker, SetAndForget) {
  FakeTree tree;
  tree.bytes = 10;
  UsageTracker t(tree.fn(), 1h);
  t.Set("/t", TreeUsage{0, 0, std::nullopt});
  EXPECT_EQ(t.Get("/t")->used_bytes, 0u);
  EXPECT_EQ(tree.walks, 0);
  t.Forget("/t");
  EXPECT_EQ(t.tracked(), 0u);
  EXPECT_EQ(t.Get("/t")->used_bytes, 10u);
  EXPECT_EQ(tree.walks, 1);
}

// A walk begun before Forget is stale for the entry made after it. Before, that entry began
// again at generation 0, the walk's own, so its older figure replaced the fresh one.
TEST(UsageTracker, AWalkFromBeforeForgetIsDiscarded) {
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<int> walks{0};
  std::atomic<bool> first_in{false};
  UsageTracker t(
      [&](const std::string&) -> Result<TreeUsage> {
        if (++walks == 1) {
          first_in = true;
          open.wait();
          return TreeUsage{1, 100, std::nullopt};  // what the tree held before
        }
        return TreeUsage{2, 200, std::nullopt};
      },
      1h);
  std::thread old([&] { (void)t.Reconcile("/t"); });
  ASSERT_TRUE(WaitFor([&] { return first_in.load(); }));
  t.Forget("/t");
  EXPECT_EQ(t.Get("/t")->used_bytes, 200u);
  gate.set_value();
  old.join();
  EXPECT_EQ(t.Get("/t")->used_bytes, 200u);
  EXPECT_EQ(walks.load(), 2);
}

// A delete during a walk, in a part of the tree the walk reaches later: the walk's result lacks
// it already. Before, it was subtracted again, and the figure ran low (the quota let writes
// past its limit until the next walk); a figure may run high, never low.
TEST(UsageTracker, ADeleteDuringAWalkDoesNotMakeTheFigureLow) {
  std::atomic<uint64_t> bytes{1000};
  std::atomic<bool> hold{false}, in_walk{false};
  UsageTracker t(
      [&](const std::string&) -> Result<TreeUsage> {
        in_walk = true;
        while (hold) std::this_thread::sleep_for(1ms);
        in_walk = false;
        return TreeUsage{1, bytes.load(), std::nullopt};  // read at the walk's end
      },
      1h);
  ASSERT_EQ(t.Get("/t")->used_bytes, 1000u);
  hold = true;
  std::thread walk([&] { (void)t.Reconcile("/t"); });
  ASSERT_TRUE(WaitFor([&] { return in_walk.load(); }));
  bytes = 700;
  t.Add("/t", -300, 0);
  hold = false;
  walk.join();
  EXPECT_GE(t.Get("/t")->used_bytes, 700u);
}

class VfsUsageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-vfsusage-XXXXXX";
    base_ = ::mkdtemp(tmpl);
    VolumeConfig cfg;
    cfg.name = "local";
    cfg.backend = "vfs";
    cfg.path = base_;
    vol_ = std::make_unique<VfsVolume>(cfg, &pool_, 1h, 0us);  // maintained figures only
    ASSERT_TRUE(vol_->Init().ok());
    vf_ = VFolderId::Parse(
              "user:11111111111111111111111111111111/"
              "abcdef0123456789abcdef0123456789")
              .value();
    ASSERT_TRUE(vol_->CreateVFolder(vf_, 0755, true, std::nullopt).ok());
  }
  void TearDown() override {
    vol_.reset();
    fs::remove_all(base_);
  }
  void ExpectMatchesWalk() {
    auto kept = vol_->GetUsage(vf_);
    auto walked = vol_->fsop().ScanTree(vol_->VFolderPath(vf_));
    ASSERT_TRUE(kept.ok() && walked.ok());
    EXPECT_EQ(kept->used_bytes, walked->used_bytes);
    EXPECT_EQ(kept->file_count, walked->file_count);
  }

  std::string base_;
  ThreadPool pool_{"scan", 2};
  std::unique_ptr<VfsVolume> vol_;
  VFolderId vf_;
};

TEST_F(VfsUsageTest, FileOperationsThroughTheVolumeKeepTheFigureExact) {
  auto first = vol_->GetUsage(vf_);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->file_count, 0u);  // a new vfolder is known to be empty: no walk
  auto measured = *first->measured_at;
  ASSERT_TRUE(vol_->Mkdir(vf_, "a/b/c", true, false).ok());
  { std::ofstream(vol_->VFolderPath(vf_) + "/a/b/c/f") << std::string(4000, 'x'); }
  vol_->AccountWrite(vf_, 4000, 1);  // what the upload service reports for its writes
  ExpectMatchesWalk();
  auto session = vol_->CreateStaging(vf_);
  ASSERT_TRUE(session.ok());
  ExpectMatchesWalk();
  ASSERT_TRUE(vol_->DeleteFiles(vf_, {"a"}, true).ok());
  ExpectMatchesWalk();
  // None of that needed a walk: the figure is still the one measured at creation.
  EXPECT_EQ(*vol_->GetUsage(vf_)->measured_at, measured);
}

TEST_F(VfsUsageTest, ScopeUsageSumsItsVFoldersFigures) {
  auto other = VFolderId::Parse(
                   "user:11111111111111111111111111111111/"
                   "00000000000000000000000000000001")
                   .value();
  ASSERT_TRUE(vol_->CreateVFolder(other, 0755, false, std::nullopt).ok());
  vol_->AccountWrite(vf_, 1000, 1);
  vol_->AccountWrite(other, 234, 1);
  auto d = vol_->quota().DescribeScope(*vf_.scope);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->used_bytes, 1234u);
  // Direct writes show up after a fresh measurement.
  std::ofstream(vol_->VFolderPath(other) + "/f") << std::string(100, 'y');
  ASSERT_EQ(vol_->GetFreshUsage(other)->used_bytes, 100u);
  EXPECT_EQ(vol_->quota().DescribeScope(*vf_.scope)->used_bytes, 1100u);
  // A deleted vfolder stops counting.
  ASSERT_TRUE(vol_->DetachVFolder(other).ok());
  EXPECT_EQ(vol_->quota().DescribeScope(*vf_.scope)->used_bytes, 1000u);
}

}  // namespace
}  // namespace sluice
