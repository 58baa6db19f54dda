#include "common/thread_pool.h"

#include <pthread.h>

namespace sluice {

ThreadPool::ThreadPool(std::string name, size_t threads, size_t max_queue)
    : name_(std::move(name)), max_queue_(max_queue) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Run(); });
    std::string tname = name_.substr(0, 12) + "-" + std::to_string(i);
    pthread_setname_np(threads_.back().native_handle(), tname.substr(0, 15).c_str());
  }
}

ThreadPool::~ThreadPool() {
  Shutdown();
}

bool ThreadPool::Submit(std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    if (stopping_ || queue_.size() >= max_queue_) return false;
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
  return true;
}

size_t ThreadPool::queued() const {
  std::lock_guard lk(mu_);
  return queue_.size();
}

void ThreadPool::Shutdown() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void ThreadPool::Run() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
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
