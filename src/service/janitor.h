// Housekeeping on a thread of its own, at start and then periodically until destroyed:
// abandoned upload sessions are swept, and every volume's trash (vfolders whose delete was cut
// short by a crash) is emptied. Failures are logged and retried at the next round, never fatal:
// a trash that cannot be emptied must not keep the daemon from serving.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "service/storage_service.h"
#include "service/upload.h"

namespace sluice {

class Janitor {
 public:
  explicit Janitor(StorageService* svc);
  ~Janitor();
  void Start();
  // Another job for every round (before Start): the S3 sweep of abandoned multipart uploads.
  void AddChore(std::string name, std::function<void()> chore);
  std::chrono::milliseconds interval() const { return interval_; }
  // One round, on the caller's thread.
  void RunOnce();

 private:
  void Loop();

  StorageService* svc_;
  UploadService uploads_;
  std::vector<std::pair<std::string, std::function<void()>>> chores_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sluice
