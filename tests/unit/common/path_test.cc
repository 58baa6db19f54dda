#include "common/path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace sluice {
namespace {

namespace fs = std::filesystem;

class PathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-path-XXXXXX";
    base_ = mkdtemp(tmpl);
    root_ = base_ + "/root";
    fs::create_directories(root_ + "/a/b");
    std::ofstream(root_ + "/a/file.txt") << "hello";
    std::ofstream(base_ + "/secret.txt") << "outside";
    fs::create_symlink("../secret.txt", root_ + "/escape");
    fs::create_symlink("/etc/passwd", root_ + "/abs");
    fs::create_symlink("a/file.txt", root_ + "/inside");
    rootfd_ = OpenDirPath(root_).value().release();
  }
  void TearDown() override {
    ::close(rootfd_);
    fs::remove_all(base_);
  }
  std::string base_, root_;
  int rootfd_ = -1;
};

TEST(SplitRelPath, Normalises) {
  auto p = SplitRelPath("./a//b/./c/");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(SplitRelPath("").value().empty());
  EXPECT_TRUE(SplitRelPath(".").value().empty());
}

TEST(SplitRelPath, RefusesHostileInput) {
  EXPECT_EQ(SplitRelPath("../x").status().code(), Code::kInvalidPath);
  EXPECT_EQ(SplitRelPath("a/../../x").status().code(), Code::kInvalidPath);
  EXPECT_EQ(SplitRelPath("/etc/passwd").status().code(), Code::kInvalidPath);
  EXPECT_EQ(SplitRelPath(std::string("a\0b", 3)).status().code(), Code::kInvalidPath);
  EXPECT_EQ(SplitRelPath(std::string(300, 'x')).status().code(), Code::kInvalidPath);
  EXPECT_EQ(SplitRelPath(std::string(5000, 'a')).status().code(), Code::kInvalidPath);
}

TEST(ValidateName, RefusesSeparatorsAndDots) {
  EXPECT_TRUE(ValidateName("ok.txt").ok());
  EXPECT_FALSE(ValidateName("a/b").ok());
  EXPECT_FALSE(ValidateName("..").ok());
  EXPECT_FALSE(ValidateName("").ok());
}

TEST_F(PathTest, OpensInside) {
  auto fd = OpenBeneath(rootfd_, "a/file.txt", O_RDONLY);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  char buf[8] = {};
  EXPECT_EQ(::read(fd->get(), buf, sizeof buf), 5);
  EXPECT_TRUE(OpenBeneath(rootfd_, "inside", O_RDONLY).ok());
}

TEST_F(PathTest, RefusesSymlinkEscapes) {
  EXPECT_EQ(OpenBeneath(rootfd_, "escape", O_RDONLY).status().code(), Code::kInvalidPath);
  EXPECT_EQ(OpenBeneath(rootfd_, "abs", O_RDONLY).status().code(), Code::kInvalidPath);
}

TEST_F(PathTest, MissingIsNotFound) {
  EXPECT_EQ(OpenBeneath(rootfd_, "nope", O_RDONLY).status().code(), Code::kNotFound);
}

TEST_F(PathTest, ParentRef) {
  auto ref = OpenParentBeneath(rootfd_, "a/b/new");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->name, "new");
  EXPECT_FALSE(OpenParentBeneath(rootfd_, ".").ok());
}

}  // namespace
}  // namespace sluice
