#include "common/thread_pool.h"

#include <pthread.h>

#include <algorithm>

#include <spdlog/spdlog.h>

namespace sluice {

ThreadPool::ThreadPool(std::string name, size_t threads, size_t max_queue, Elastic elastic)
    : name_(std::move(name)),
      max_queue_(max_queue),
      max_threads_(std::max(elastic.max_threads, std::max<size_t>(threads, 1))),
      grow_after_(elastic.grow_after),
      idle_exit_(elastic.idle_exit) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i) Spawn(false);
  if (max_threads_ > running_) monitor_ = std::thread([this] { Monitor(); });
}

ThreadPool::~ThreadPool() {
  Shutdown();
}

void ThreadPool::Spawn(bool extra) {
  threads_.emplace_back([this, extra] { Run(extra); });
  ++running_;
  ++idle_;  // free from its start: the monitor does not start another for the same task
  std::string tname = name_.substr(0, 10) + "-" + std::to_string(spawned_++);
  pthread_setname_np(threads_.back().native_handle(), tname.substr(0, 15).c_str());
  if (g_threads_) g_threads_->store(static_cast<int64_t>(running_));
  if (extra && running_ == max_threads_ && !warned_full_) {
    warned_full_ = true;
    spdlog::warn(
        "thread pool '{}' is at its maximum of {} threads, all busy: more work waits in its "
        "queue (a volume that does not answer holds them?)",
        name_, max_threads_);
  }
}

bool ThreadPool::Submit(std::function<void()> fn) {
  bool wake_monitor = false;
  {
    std::lock_guard lk(mu_);
    if (stopping_ || queue_.size() >= max_queue_) return false;
    queue_.push_back({Clock::now(), std::move(fn)});
    wake_monitor = monitor_asleep_ && queue_.size() > idle_;
    if (wake_monitor) monitor_asleep_ = false;
  }
  cv_.notify_one();
  if (wake_monitor) monitor_cv_.notify_one();
  return true;
}

void ThreadPool::Monitor() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    if (!exited_.empty()) {  // threads that left after idling: joined off the lock
      std::vector<std::thread> done;
      for (const auto& id : exited_) {
        auto it = std::find_if(threads_.begin(), threads_.end(),
                               [&](const std::thread& t) { return t.get_id() == id; });
        if (it == threads_.end()) continue;
        done.push_back(std::move(*it));
        threads_.erase(it);
      }
      exited_.clear();
      lk.unlock();
      for (auto& t : done) t.join();
      lk.lock();
      continue;
    }
    if (queue_.size() <= idle_) {  // every task has a free thread
      monitor_asleep_ = true;
      monitor_cv_.wait(lk);
      monitor_asleep_ = false;
      continue;
    }
    // Tasks wait and no thread is free: the ones that have waited `grow_after` get threads.
    const auto now = Clock::now();
    size_t late = 0;
    for (const auto& t : queue_) {
      if (now - t.queued < grow_after_) break;
      ++late;
    }
    for (size_t n = late > idle_ ? late - idle_ : 0; n > 0 && running_ < max_threads_; --n)
      Spawn(true);
    monitor_cv_.wait_for(lk, grow_after_ / 4 + std::chrono::milliseconds(1));
  }
}

size_t ThreadPool::size() const {
  std::lock_guard lk(mu_);
  return running_;
}

size_t ThreadPool::queued() const {
  std::lock_guard lk(mu_);
  return queue_.size();
}

size_t ThreadPool::busy() const {
  std::lock_guard lk(mu_);
  return running_ - idle_;
}

void ThreadPool::SetGauges(std::atomic<int64_t>* threads, std::atomic<int64_t>* busy) {
  std::lock_guard lk(mu_);
  g_threads_ = threads;
  g_busy_ = busy;
  if (g_threads_) g_threads_->store(static_cast<int64_t>(running_));
}

void ThreadPool::Shutdown() {
  std::vector<std::thread> threads;
  std::thread monitor;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    threads.swap(threads_);
    monitor.swap(monitor_);
    exited_.clear();
  }
  cv_.notify_all();
  monitor_cv_.notify_all();
  if (monitor.joinable()) monitor.join();
  for (auto& t : threads)
    if (t.joinable()) t.join();
}

void ThreadPool::Run(bool extra) {
  for (bool first = true;; first = false) {
    std::function<void()> fn;
    {
      std::unique_lock lk(mu_);
      auto ready = [this] { return stopping_ || !queue_.empty(); };
      if (!first) ++idle_;  // Spawn() counted it at its start
      const bool woke = extra ? cv_.wait_for(lk, idle_exit_, ready) : (cv_.wait(lk, ready), true);
      --idle_;
      if (!woke || queue_.empty()) {  // an added thread idle for long, or stopping and drained
        --running_;
        if (g_threads_) g_threads_->store(static_cast<int64_t>(running_));
        if (running_ <= max_threads_ / 2) warned_full_ = false;
        if (!stopping_) {
          exited_.push_back(std::this_thread::get_id());
          monitor_cv_.notify_one();
        }
        return;
      }
      fn = std::move(queue_.front().fn);
      queue_.pop_front();
    }
    if (g_busy_) g_busy_->fetch_add(1, std::memory_order_relaxed);
    fn();
    if (g_busy_) g_busy_->fetch_sub(1, std::memory_order_relaxed);
  }
}

void WaitGroup::Add(size_t n) {
  std::lock_guard lk(mu_);
  count_ += n;
}

void WaitGroup::Done() {
  std::lock_guard lk(mu_);
  if (--count_ == 0) cv_.notify_all();
}

void WaitGroup::Wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [this] { return count_ == 0; });
}

}  // namespace sluice
