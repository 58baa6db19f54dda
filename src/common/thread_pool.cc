#include "common/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <system_error>

#include <spdlog/spdlog.h>

namespace sluice {

ThreadPool::ThreadPool(std::string name, size_t threads, size_t max_queue, Elastic elastic)
    : name_(std::move(name)),
      max_queue_(max_queue),
      base_(std::max<size_t>(threads, 1)),
      max_threads_(std::max(elastic.max_threads, base_)),
      grow_after_(elastic.grow_after),
      idle_exit_(elastic.idle_exit) {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < base_; ++i) Spawn(false);
  if (max_threads_ > base_) monitor_ = std::thread([this] { Monitor(); });
}

ThreadPool::~ThreadPool() {
  Shutdown();
}

bool ThreadPool::Spawn(bool extra) {
  try {
    threads_.emplace_back([this, extra] { Run(extra); });
  } catch (const std::system_error& e) {
    if (!extra) throw;  // the pool's own threads: the pool cannot work without them
    if (!warned_spawn_) {
      warned_spawn_ = true;
      spdlog::warn("thread pool '{}': cannot start another thread ({}); work waits in its queue",
                   name_, e.what());
    }
    return false;
  }
  ++running_;
  ++idle_;  // free from its start: the monitor does not start another for the same task
  std::string tname = name_.substr(0, 12) + "-" + std::to_string(spawned_++);
  pthread_setname_np(threads_.back().native_handle(), tname.substr(0, 15).c_str());
  if (g_threads_) g_threads_->store(static_cast<int64_t>(running_));
  if (extra && running_ == max_threads_ && !warned_full_) {
    warned_full_ = true;
    spdlog::warn(
        "thread pool '{}' is at its maximum of {} threads, all busy: more work waits in its "
        "queue (a volume that does not answer holds them?)",
        name_, max_threads_);
  }
  return true;
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
  auto window = Clock::now();  // since when at least `low_idle` threads were idle, sampled
  size_t low_idle = SIZE_MAX;
  while (!stopping_) {
    if (!exited_.empty()) {  // threads that left: joined off the lock
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
    const auto now = Clock::now();
    // Shrink: threads idle at every look through `idle_exit` are more than the pool needs;
    // that many added threads leave. (Which thread a task wakes is the kernel's choice, so a
    // light load would keep every thread alive if each left after its own idle time.)
    const size_t added = running_ - retire_ - std::min(running_ - retire_, base_);
    if (added > 0) {
      low_idle = std::min(low_idle, idle_);
      if (now - window >= idle_exit_) {
        if (const size_t surplus = std::min(low_idle, added); surplus > 0) {
          retire_ += surplus;
          cv_.notify_all();
        }
        window = now;
        low_idle = SIZE_MAX;
      }
    } else {
      window = now;
      low_idle = SIZE_MAX;
    }
    if (queue_.size() > idle_) {
      // Tasks wait and no thread is free: the ones that have waited `grow_after` get threads.
      const size_t cap = idle_ + (max_threads_ - std::min(max_threads_, running_));
      size_t late = 0;
      for (const auto& t : queue_) {
        if (late >= cap || now - t.queued < grow_after_) break;
        ++late;
      }
      size_t n = late > idle_ ? late - idle_ : 0;
      const size_t kept = std::min(retire_, n);  // threads asked to leave stay instead
      retire_ -= kept;
      for (n -= kept; n > 0 && running_ < max_threads_; --n)
        if (!Spawn(true)) break;
      monitor_cv_.wait_for(lk, grow_after_ / 4 + std::chrono::milliseconds(1));
    } else if (added > 0) {
      monitor_cv_.wait_for(lk, idle_exit_ / 8 + std::chrono::milliseconds(1));
    } else {  // nothing waits, nothing to shrink: until Submit() finds every thread busy
      monitor_asleep_ = true;
      monitor_cv_.wait(lk);
      monitor_asleep_ = false;
    }
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
      if (!first) ++idle_;  // Spawn() counted it at its start
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || (extra && retire_ > 0); });
      --idle_;
      const bool retired = extra && retire_ > 0 && !stopping_ && queue_.empty();
      if (retired || queue_.empty()) {  // the monitor shrinks the pool, or stopping and drained
        if (retired) --retire_;
        --running_;
        if (g_threads_) g_threads_->store(static_cast<int64_t>(running_));
        if (running_ <= max_threads_ / 2) warned_full_ = warned_spawn_ = false;
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
    // The last line of defence: a task's exception would end the process from here. Callers
    // turn their own into answers; what reaches this point is logged and dropped.
    try {
      fn();
    } catch (const std::exception& e) {
      spdlog::error("thread pool {}: a task threw: {}", name_, e.what());
    } catch (...) {
      spdlog::error("thread pool {}: a task threw a non-standard exception", name_);
    }
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
