#include "support/loop_fs.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include <gtest/gtest.h>

namespace sluice::test {

namespace {

std::mutex g_mu;
std::map<std::string, std::unique_ptr<LoopFs>>* g_instances = nullptr;

std::string Tool(const std::string& name) {
  return std::string(SLUICE_TEST_TOOLS_DIR) + "/" + name + "-loop.sh";
}

std::string Upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Removes the filesystems after the last test, whatever the tests did.
class LoopFsEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    std::lock_guard lk(g_mu);
    if (!g_instances) return;
    for (auto& [name, fs] : *g_instances) fs->TearDown();
  }
};
[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new LoopFsEnvironment);

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

LoopFs& LoopFs::Shared(const std::string& name, const std::string& size) {
  std::lock_guard lk(g_mu);
  if (!g_instances) g_instances = new std::map<std::string, std::unique_ptr<LoopFs>>();
  auto& slot = (*g_instances)[name];
  if (!slot) {
    slot.reset(new LoopFs(name));
    slot->SetUp(size);
  }
  return *slot;
}

void LoopFs::SetUp(const std::string& size) {
  std::string out;
  RunCommand(Tool(name_) + " sweep", &out);  // leftovers of crashed runs
  std::string tmpl = "/tmp/sluice-" + name_ + "-" + std::to_string(::getpid()) + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    error_ = "mkdtemp failed";
    return;
  }
  dir_ = tmpl;
  std::string cmd = "SLUICE_" + Upper(name_) + "_OWNER=" + std::to_string(::getpid()) + " " +
                    Tool(name_) + " up " + dir_ + " " + size;
  if (RunCommand(cmd, &out) != 0) {
    error_ = "'" + cmd + "' failed: " + out;
    RunCommand(Tool(name_) + " down " + dir_, &out);
    return;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  mount_ = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  std::ifstream(dir_ + "/loopdev") >> device_;
}

std::string LoopFs::MakeTempDir(const std::string& prefix) const {
  std::string tmpl = mount_ + "/" + prefix + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return "";
  return tmpl;
}

void LoopFs::TearDown() {
  if (dir_.empty()) return;
  std::string out;
  if (RunCommand(Tool(name_) + " down " + dir_, &out) != 0)
    std::fprintf(stderr, "%s-loop: teardown of %s failed: %s\n", name_.c_str(), dir_.c_str(),
                 out.c_str());
  dir_.clear();
  mount_.clear();
}

}  // namespace sluice::test
