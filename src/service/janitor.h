// Housekeeping on a thread of its own, at start and then periodically until destroyed:
// abandoned upload sessions are swept, and every volume's trash (vfolders whose delete was cut
// short by a crash) is emptied. Failures are logged and retried at the next round, never fatal:
// a trash that cannot be emptied must not keep the daemon from serving.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "service/storage_service.h"
#include "service/upload.h"

namespace sluice {

class Janitor {
 public:
  explicit Janitor(StorageService* svc);
  ~Janitor();
  void Start();
  std::chrono::milliseconds interval() const { return interval_; }
  // One round, on the caller's thread.
  void RunOnce();

 private:
  void Loop();

  StorageService* svc_;
  UploadService uploads_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sluice
