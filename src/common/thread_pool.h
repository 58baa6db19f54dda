// A fixed-size pool of worker threads for blocking filesystem work, so that network event loops
// never block. The pool is bounded in threads; its queue is bounded too, and Submit() reports
// overload instead of queueing without limit.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sluice {

class ThreadPool {
 public:
  ThreadPool(std::string name, size_t threads, size_t max_queue = 1 << 20);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `fn`; false when the pool is stopping or its queue is full.
  bool Submit(std::function<void()> fn);
  // Finishes queued work, then joins the threads. Idempotent.
  void Shutdown();

  size_t size() const { return threads_.size(); }
  size_t queued() const;
  const std::string& name() const { return name_; }

 private:
  void Run();

  std::string name_;
  size_t max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Waits for a dynamic set of tasks (a tree walk that discovers work as it goes).
class WaitGroup {
 public:
  void Add(size_t n = 1);
  void Done();
  void Wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t count_ = 0;
};

}  // namespace sluice
