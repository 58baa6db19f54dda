#include "common/tree_walk.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

namespace sluice {
namespace {

namespace fs = std::filesystem;

class TreeWalkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-walk-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = tmpl;
  }
  void TearDown() override {
    // Deep trees are beyond std::filesystem's recursion: removed the way under test.
    UniqueFd parent(::open("/tmp", O_RDONLY | O_DIRECTORY));
    EXPECT_TRUE(RemoveTreeAt(parent.get(), fs::path(base_).filename()).ok());
  }

  UniqueFd Open(const std::string& p) {
    return UniqueFd(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }

  // A chain d/d/d/... `depth` levels deep below `root`, with a file at the bottom.
  void MakeChain(int root, int depth) {
    UniqueFd cur(::openat(root, ".", O_RDONLY | O_DIRECTORY));
    for (int i = 0; i < depth; ++i) {
      ASSERT_EQ(::mkdirat(cur.get(), "d", 0755), 0);
      cur = UniqueFd(::openat(cur.get(), "d", O_RDONLY | O_DIRECTORY));
      ASSERT_TRUE(cur.valid());
    }
    UniqueFd f(::openat(cur.get(), "leaf", O_CREAT | O_WRONLY, 0644));
    ASSERT_EQ(::write(f.get(), "bottom", 6), 6);
  }

  std::string base_;
};

// The file-descriptor limit lowered for one test, restored after it.
class FdLimit {
 public:
  explicit FdLimit(rlim_t n) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    struct rlimit rl = saved_;
    rl.rlim_cur = n;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  ~FdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  struct rlimit saved_;
};

TEST_F(TreeWalkTest, DeepTreesWithFewDescriptorsAndNoPaths) {
  fs::create_directories(base_ + "/src");
  fs::create_directories(base_ + "/dst");
  UniqueFd src = Open(base_ + "/src");
  UniqueFd dst = Open(base_ + "/dst");
  MakeChain(src.get(), 10000);  // 20,000 bytes of path: far past PATH_MAX
  {
    FdLimit limit(64);  // far fewer than the depth
    auto c = CountTree(src.get());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->entries, 10001u);  // 10,000 directories and the leaf
    EXPECT_EQ(c->bytes, 6u);
    Status copied = CopyTreeInto(src.get(), dst.get());
    ASSERT_TRUE(copied.ok()) << copied.ToString();
    auto cc = CountTree(dst.get());
    ASSERT_TRUE(cc.ok());
    EXPECT_EQ(cc->entries, 10001u);
    EXPECT_EQ(cc->bytes, 6u);
    TreeCount removed;
    Status rm = RemoveTreeAt(src.get(), "d", &removed);
    ASSERT_TRUE(rm.ok()) << rm.ToString();
    EXPECT_EQ(removed.entries, 10001u);
    EXPECT_EQ(removed.bytes, 6u);
  }
  EXPECT_TRUE(fs::is_empty(base_ + "/src"));
}

TEST_F(TreeWalkTest, CopyKeepsModesTimesAndLinksAndLeavesSpecialFilesOut) {
  fs::create_directories(base_ + "/src/a/b");
  fs::create_directories(base_ + "/dst");
  std::ofstream(base_ + "/src/a/b/f") << "data";
  fs::create_symlink("../outside", base_ + "/src/a/link");
  ASSERT_EQ(::mkfifo((base_ + "/src/a/fifo").c_str(), 0644), 0);
  ::chmod((base_ + "/src/a/b").c_str(), 0500);  // read-only: filled before its mode is set
  ::chmod((base_ + "/src/a/b/f").c_str(), 0640);
  UniqueFd src = Open(base_ + "/src");
  UniqueFd dst = Open(base_ + "/dst");
  ASSERT_TRUE(CopyTreeInto(src.get(), dst.get()).ok());
  EXPECT_EQ(fs::read_symlink(base_ + "/dst/a/link"), "../outside");
  EXPECT_FALSE(fs::exists(fs::symlink_status(base_ + "/dst/a/fifo")));
  struct stat sb;
  ASSERT_EQ(::stat((base_ + "/dst/a/b").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0500u);
  ASSERT_EQ(::stat((base_ + "/dst/a/b/f").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0640u);
  std::ifstream in(base_ + "/dst/a/b/f");
  std::string got;
  in >> got;
  EXPECT_EQ(got, "data");
  ::chmod((base_ + "/src/a/b").c_str(), 0700);
  ::chmod((base_ + "/dst/a/b").c_str(), 0700);
}

// A directory moved elsewhere while the walk is below it: the walk must not climb into the new
// parent (out of the tree) but stop.
TEST_F(TreeWalkTest, ClimbingBackChecksItIsTheSameDirectory) {
  fs::create_directories(base_ + "/tree");
  fs::create_directories(base_ + "/elsewhere");
  UniqueFd tree = Open(base_ + "/tree");
  MakeChain(tree.get(), 20);
  DirStack stack(2);
  ASSERT_TRUE(stack.Push(Open(base_ + "/tree")).ok());
  std::string p = base_ + "/tree";
  for (int i = 0; i < 5; ++i) {
    p += "/d";
    ASSERT_TRUE(stack.Push(Open(p)).ok());
  }
  // Climbing back re-opens through "..": fine while nothing moved.
  ASSERT_TRUE(stack.Pop().ok());
  ASSERT_TRUE(stack.Pop().ok());
  // tree/d/d/d is now the top (open); move tree/d/d under `elsewhere`: its ".." is elsewhere.
  ASSERT_TRUE(stack.Pop().ok());
  p = base_ + "/tree/d/d/d";
  ASSERT_TRUE(stack.Push(Open(p)).ok());
  ASSERT_TRUE(stack.Push(Open(p + "/d")).ok());
  ASSERT_TRUE(stack.Push(Open(p + "/d/d")).ok());
  fs::rename(base_ + "/tree/d/d", base_ + "/elsewhere/moved");
  Status climbed = Status::Ok();
  while (climbed.ok() && stack.depth() > 1) climbed = stack.Pop();
  EXPECT_EQ(climbed.code(), Code::kConflict) << climbed.ToString();
}

// A thread swaps directories for symbolic links to an outside tree while a copy runs: nothing
// from outside ever lands in the copy (the copy may fail, or copy the link as a link).
TEST_F(TreeWalkTest, CopyUnderRacingSymlinkSwapsNeverLeavesTheTree) {
  fs::create_directories(base_ + "/outside");
  std::ofstream(base_ + "/outside/secret") << "secret";
  for (int i = 0; i < 200; ++i) {
    fs::create_directories(base_ + "/src/d" + std::to_string(i) + "/sub");
    std::ofstream(base_ + "/src/d" + std::to_string(i) + "/sub/own") << "own";
  }
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    int i = 0;
    while (!stop) {
      std::string d = base_ + "/src/d" + std::to_string(i % 200) + "/sub";
      std::error_code ec;
      fs::rename(d, d + ".away", ec);
      fs::create_directory_symlink(base_ + "/outside", d, ec);
      std::this_thread::yield();
      fs::remove(d, ec);
      fs::rename(d + ".away", d, ec);
      ++i;
    }
  });
  size_t checked = 0;
  for (int round = 0; round < 5; ++round) {
    std::string dst = base_ + "/dst" + std::to_string(round);
    fs::create_directories(dst);
    UniqueFd s = Open(base_ + "/src");
    UniqueFd d = Open(dst);
    // May fail when a swap is caught mid-entry; what was copied until then is checked too.
    (void)CopyTreeInto(s.get(), d.get());
    for (auto it = fs::recursive_directory_iterator(dst); it != fs::recursive_directory_iterator();
         ++it, ++checked)
      EXPECT_NE(it->path().filename(), "secret") << it->path();
  }
  stop = true;
  swapper.join();
  EXPECT_GT(checked, 200u);  // the copies got somewhere: the check above saw their entries
}

TEST_F(TreeWalkTest, RemoveTakesEntriesCreatedWhileItRuns) {
  fs::create_directories(base_ + "/t");
  for (int i = 0; i < 50; ++i) fs::create_directories(base_ + "/t/d" + std::to_string(i) + "/x");
  UniqueFd root = Open(base_);
  std::atomic<bool> stop{false};
  std::thread creator([&] {
    for (int i = 0; !stop && i < 2000; ++i) {
      std::error_code ec;
      std::ofstream(base_ + "/t/d0/x/late" + std::to_string(i));
    }
  });
  Status st = RemoveTreeAt(root.get(), "t");
  stop = true;
  creator.join();
  // Either all of it went, or what the creator made after the last pass is left in an
  // otherwise removed tree; a second pass (as the janitor would) finishes it.
  if (!st.ok()) st = RemoveTreeAt(root.get(), "t");
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(fs::exists(base_ + "/t"));
}

}  // namespace
}  // namespace sluice
