// Logging: spdlog to stderr with one pattern for every component.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include <spdlog/spdlog.h>

namespace sluice {

// `level`: trace, debug, info, warning, error, critical.
void InitLogging(const std::string& level);

// Lets a message through at most once per interval, so that a condition that repeats fast (an
// accept loop out of descriptors) cannot flood the log. Thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::steady_clock::duration interval) : interval_(interval) {}
  // True when this occurrence is to be logged; `*held_back` receives how many were not since the
  // last one that was.
  bool Allow(uint64_t* held_back) {
    std::lock_guard lk(mu_);
    auto now = std::chrono::steady_clock::now();
    if (logged_once_ && now - last_ < interval_) {
      ++held_;
      return false;
    }
    logged_once_ = true;
    last_ = now;
    *held_back = held_;
    held_ = 0;
    return true;
  }

 private:
  std::mutex mu_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_;
  bool logged_once_ = false;
  uint64_t held_ = 0;
};

}  // namespace sluice
