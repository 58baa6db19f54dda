// A pool of worker threads for blocking filesystem work, so that network event loops never block.
// It keeps `threads` running; an elastic one (max_threads above that) adds a thread whenever work
// arrives and none is idle, up to `max_threads`, and lets the added ones go after `idle_exit`
// without work: requests stuck on a volume that does not answer (a stalled origin, a hung network
// mount) hold threads of their own instead of queueing every other request behind them. Its
// queue is bounded too, and Submit() reports overload instead of queueing without limit.
#pragma once

#include <atomic>
#include <chrono>
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
  ThreadPool(std::string name, size_t threads, size_t max_queue = 1 << 20, size_t max_threads = 0,
             std::chrono::milliseconds idle_exit = std::chrono::seconds(30));
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `fn`; false when the pool is stopping or its queue is full.
  bool Submit(std::function<void()> fn);
  // Finishes queued work, then joins the threads. Idempotent.
  void Shutdown();

  // Threads running now (the permanent ones and the added ones).
  size_t size() const;
  size_t queued() const;
  // Tasks running now.
  size_t busy() const;
  size_t max_threads() const { return max_threads_; }
  // Gauges kept current with the threads running and the tasks running (for /metrics); set
  // before the first Submit().
  void SetGauges(std::atomic<int64_t>* threads, std::atomic<int64_t>* busy);
  const std::string& name() const { return name_; }

 private:
  void Run(bool extra);
  void Spawn(bool extra);  // mu_ held
  void ReapLocked(std::vector<std::thread>* out);

  std::string name_;
  size_t max_queue_, max_threads_;
  std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  size_t idle_ = 0, running_ = 0, spawned_ = 0;
  std::vector<std::thread> threads_;
  // Added threads that left after idling: joined by the next Submit() or Shutdown().
  std::vector<std::thread::id> exited_;
  std::atomic<int64_t>*g_threads_ = nullptr, *g_busy_ = nullptr;
  bool warned_full_ = false;  // logged reaching max_threads_ (again once it has shrunk)
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
