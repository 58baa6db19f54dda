#include "xfs_loop.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <mutex>

#include <gtest/gtest.h>

#include "btrfs_loop.h"  // RunCommand

namespace sluice::test {

namespace {

const std::string kTool = std::string(SLUICE_TEST_TOOLS_DIR) + "/xfs-loop.sh";

XfsLoop* g_instance = nullptr;

// Removes the shared filesystem after the last test, whatever the tests did.
class XfsLoopEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_instance) g_instance->TearDown();
  }
};
[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new XfsLoopEnvironment);

}  // namespace

XfsLoop& XfsLoop::Shared() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_instance = new XfsLoop();
    g_instance->SetUp();
  });
  return *g_instance;
}

void XfsLoop::SetUp() {
  std::string out;
  RunCommand(kTool + " sweep", &out);  // leftovers of crashed runs
  std::string tmpl = "/tmp/sluice-xfs-" + std::to_string(::getpid()) + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    error_ = "mkdtemp failed";
    return;
  }
  dir_ = tmpl;
  std::string cmd =
      "SLUICE_XFS_OWNER=" + std::to_string(::getpid()) + " " + kTool + " up " + dir_ + " 512M";
  if (RunCommand(cmd, &out) != 0) {
    error_ = "'" + cmd + "' failed: " + out;
    RunCommand(kTool + " down " + dir_, &out);
    return;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  mount_ = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  std::ifstream(dir_ + "/loopdev") >> device_;
}

std::string XfsLoop::MakeTempDir(const std::string& prefix) const {
  std::string tmpl = mount_ + "/" + prefix + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return "";
  return tmpl;
}

void XfsLoop::TearDown() {
  if (dir_.empty()) return;
  std::string out;
  if (RunCommand(kTool + " down " + dir_, &out) != 0)
    std::fprintf(stderr, "xfs-loop: teardown of %s failed: %s\n", dir_.c_str(), out.c_str());
  dir_.clear();
  mount_.clear();
}

}  // namespace sluice::test
