#include "common/thread_pool.h"

#include <pthread.h>

#include <algorithm>

#include <spdlog/spdlog.h>

namespace sluice {

ThreadPool::ThreadPool(std::string name, size_t threads, size_t max_queue, size_t max_threads,
                       std::chrono::milliseconds idle_exit)
    : name_(std::move(name)),
      max_queue_(max_queue),
      max_threads_(std::max(max_threads, std::max<size_t>(threads, 1))),
      idle_exit_(idle_exit) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i) Spawn(false);
}

ThreadPool::~ThreadPool() {
  Shutdown();
}

void ThreadPool::Spawn(bool extra) {
  threads_.emplace_back([this, extra] { Run(extra); });
  ++running_;
  ++idle_;  // free from its start: the next Submit() does not start another for the same task
  if (g_threads_) g_threads_->store(static_cast<int64_t>(running_));
  if (extra && running_ == max_threads_ && !warned_full_) {
    warned_full_ = true;
    spdlog::warn(
        "thread pool '{}' is at its maximum of {} threads, all busy: more work waits in its "
        "queue (a volume that does not answer holds them?)",
        name_, max_threads_);
  }
  std::string tname = name_.substr(0, 10) + "-" + std::to_string(spawned_++);
  pthread_setname_np(threads_.back().native_handle(), tname.substr(0, 15).c_str());
}

void ThreadPool::ReapLocked(std::vector<std::thread>* out) {
  for (const auto& id : exited_) {
    auto it = std::find_if(threads_.begin(), threads_.end(),
                           [&](const std::thread& t) { return t.get_id() == id; });
    if (it == threads_.end()) continue;
    out->push_back(std::move(*it));
    threads_.erase(it);
  }
  exited_.clear();
}

bool ThreadPool::Submit(std::function<void()> fn) {
  std::vector<std::thread> done;
  {
    std::lock_guard lk(mu_);
    if (stopping_ || queue_.size() >= max_queue_) return false;
    queue_.push_back(std::move(fn));
    // Every thread busy: one more, rather than this task waiting behind ones that may be
    // stuck on a volume that does not answer.
    if (idle_ < queue_.size() && running_ < max_threads_) Spawn(true);
    ReapLocked(&done);
  }
  cv_.notify_one();
  for (auto& t : done) t.join();  // they have left Run(): nothing to wait for
  return true;
}

void ThreadPool::SetGauges(std::atomic<int64_t>* threads, std::atomic<int64_t>* busy) {
  std::lock_guard lk(mu_);
  g_threads_ = threads;
  g_busy_ = busy;
  if (g_threads_) g_threads_->store(static_cast<int64_t>(running_));
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

void ThreadPool::Shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    threads.swap(threads_);
    exited_.clear();
  }
  cv_.notify_all();
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
        if (!stopping_) exited_.push_back(std::this_thread::get_id());
        return;
      }
      fn = std::move(queue_.front());
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
