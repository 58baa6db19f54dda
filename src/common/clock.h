// Time formatting shared by the APIs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace sluice {

// ISO 8601 in UTC with microseconds: "2026-11-29T17:25:50.123456+00:00".
std::string FormatIso8601(std::chrono::system_clock::time_point tp);
// ISO 8601 in UTC with milliseconds and a Z, as S3 writes times: "2026-12-02T04:15:52.123Z"
// (floored to the millisecond, before 1970 too).
std::string FormatIso8601Millis(std::chrono::system_clock::time_point tp);

// A file's time (seconds and nanoseconds since the epoch, as stat gives it) on the system
// clock. Its nanoseconds reach about year 2262 either way: a time past that (touch -d
// 2400-01-01) is clamped, not wrapped into the past by an overflow.
std::chrono::system_clock::time_point UnixTime(int64_t sec, int64_t nsec);

// Seconds on a monotonic clock, for durations.
double MonotonicSeconds();

// Monotonic time as a component sees it: the real clock, or in tests one moved by hand, so that
// a test of a 10-second timeout does not sleep for 10 seconds.
class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual std::chrono::steady_clock::time_point Now() const {
    return std::chrono::steady_clock::now();
  }
  static const TimeSource& Real();
};

class ManualTime : public TimeSource {
 public:
  std::chrono::steady_clock::time_point Now() const override { return now_.load(); }
  void Advance(std::chrono::steady_clock::duration d) { now_.store(now_.load() + d); }

 private:
  std::atomic<std::chrono::steady_clock::time_point> now_{std::chrono::steady_clock::now()};
};

}  // namespace sluice
