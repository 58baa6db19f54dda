#include "common/clock.h"

#include <ctime>

#include <fmt/format.h>

namespace sluice {

std::string FormatIso8601(std::chrono::system_clock::time_point tp) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(tp.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  long frac = static_cast<long>(us % 1000000);
  if (frac < 0) {
    frac += 1000000;
    secs -= 1;
  }
  struct tm tm;
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
}

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const TimeSource& TimeSource::Real() {
  static const TimeSource real;
  return real;
}

}  // namespace sluice
