#include "btrfs_loop.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

#include <gtest/gtest.h>

namespace sluice::test {

namespace {

const std::string kTool = std::string(SLUICE_TEST_TOOLS_DIR) + "/btrfs-loop.sh";

BtrfsLoop* g_instance = nullptr;

// Removes the shared filesystem after the last test, whatever the tests did.
class BtrfsLoopEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_instance) g_instance->TearDown();
  }
};
[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new BtrfsLoopEnvironment);

}  // namespace

int RunCommand(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = ::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

BtrfsLoop& BtrfsLoop::Shared() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_instance = new BtrfsLoop();
    g_instance->SetUp();
  });
  return *g_instance;
}

void BtrfsLoop::SetUp() {
  std::string out;
  RunCommand(kTool + " sweep", &out);  // leftovers of crashed runs
  std::string tmpl = "/tmp/sluice-btrfs-" + std::to_string(::getpid()) + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    error_ = "mkdtemp failed";
    return;
  }
  dir_ = tmpl;
  std::string cmd =
      "SLUICE_BTRFS_OWNER=" + std::to_string(::getpid()) + " " + kTool + " up " + dir_ + " 1G";
  if (RunCommand(cmd, &out) != 0) {
    error_ = "'" + cmd + "' failed: " + out;
    RunCommand(kTool + " down " + dir_, &out);
    return;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  mount_ = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
}

std::string BtrfsLoop::MakeTempDir(const std::string& prefix) const {
  std::string tmpl = mount_ + "/" + prefix + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return "";
  return tmpl;
}

void BtrfsLoop::TearDown() {
  if (dir_.empty()) return;
  std::string out;
  if (RunCommand(kTool + " down " + dir_, &out) != 0)
    std::fprintf(stderr, "btrfs-loop: teardown of %s failed: %s\n", dir_.c_str(), out.c_str());
  dir_.clear();
  mount_.clear();
}

}  // namespace sluice::test
