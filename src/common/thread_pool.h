// A pool of worker threads for blocking filesystem work, so that network event loops never block.
// It keeps `threads` running. An elastic one (Elastic::max_threads above that) watches its queue:
// a task that has waited `grow_after` while no thread was free gets a thread of its own, up to
// `max_threads`; as many added threads as were idle throughout the last `idle_exit` leave. Requests
// stuck on a volume that does not answer (a stalled origin, a hung network mount) then hold threads
// of their own instead of queueing every other request behind them, while a pool that is merely
// busy (tasks that finish, queued for less than `grow_after`) keeps its size, rather than
// turning a burst into hundreds of threads contending for the same disk and directories. Its
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

// How an elastic ThreadPool grows (see there).
struct PoolGrowth {
  size_t max_threads = 0;  // 0 or at most the pool's threads: a fixed pool
  std::chrono::milliseconds grow_after{100};
  std::chrono::milliseconds idle_exit{30000};
};

class ThreadPool {
 public:
  using Elastic = PoolGrowth;
  ThreadPool(std::string name, size_t threads, size_t max_queue = 1 << 20, Elastic elastic = {});
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
  using Clock = std::chrono::steady_clock;
  void Run(bool extra);
  bool Spawn(bool extra);  // mu_ held; false: the system would not start another thread
  // An elastic pool's: adds threads for late tasks, retires those the load no longer needs,
  // joins those that left.
  void Monitor();

  std::string name_;
  size_t max_queue_, base_, max_threads_;
  std::chrono::milliseconds grow_after_, idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_, monitor_cv_;
  struct Task {
    Clock::time_point queued;
    std::function<void()> fn;
  };
  std::deque<Task> queue_;
  std::thread monitor_;
  bool monitor_asleep_ = false;  // waiting for work to pile up: Submit() wakes it
  bool stopping_ = false;
  size_t idle_ = 0, running_ = 0, spawned_ = 0;
  size_t retire_ = 0;  // added threads asked to leave (the next ones idle do)
  std::vector<std::thread> threads_;
  // Added threads that left after idling: joined by the monitor, or Shutdown().
  std::vector<std::thread::id> exited_;
  std::atomic<int64_t>*g_threads_ = nullptr, *g_busy_ = nullptr;
  // Logged reaching max_threads_, or failing to start a thread (again once it has shrunk).
  bool warned_full_ = false, warned_spawn_ = false;
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
