#include "common/temp_files.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <thread>

namespace sluice::temp_files {

namespace {
std::mutex mu;
std::set<std::string>& Paths() {
  static auto* paths = new std::set<std::string>();  // never destroyed: the waiter may run late
  return *paths;
}
}  // namespace

int Create(const std::string& path, int flags, mode_t mode) {
  // Under the lock the signal thread takes first: it finds the file tracked, or not yet made.
  std::lock_guard<std::mutex> g(mu);
  int fd = ::open(path.c_str(), flags | O_CREAT | O_EXCL, mode);
  if (fd >= 0) Paths().insert(path);
  return fd;
}

void Forget(const std::string& path) {
  std::lock_guard<std::mutex> g(mu);
  Paths().erase(path);
}

void RemoveOnSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;
  // A plain thread waiting with sigwait, not a handler: it may take the lock and unlink.
  std::thread([set] {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return;
    {
      std::lock_guard<std::mutex> g(mu);
      for (const auto& p : Paths()) ::unlink(p.c_str());
      Paths().clear();
    }
    // Dies of the signal (its exit status says so to the shell), as without this thread.
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
    ::_exit(128 + sig);
  }).detach();
}

}  // namespace sluice::temp_files
