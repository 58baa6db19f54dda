#include "common/clock.h"

#include <algorithm>
#include <ctime>
#include <limits>

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

// Digit by digit (a listing formats one per key): the date from the day number with Howard
// Hinnant's civil_from_days, no gmtime or strftime.
std::string FormatIso8601Millis(std::chrono::system_clock::time_point t) {
  const int64_t ms = std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const int64_t secs = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
  const int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
  const int64_t sod = secs - days * 86400, milli = ms - secs * 1000;
  const int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const int64_t year = yoe + era * 400 + (month <= 2);
  if (year < 0 || year > 9999)
    return fmt::format("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}.{:03d}Z", year, month, day,
                       sod / 3600, sod / 60 % 60, sod % 60, milli);
  std::string out = "0000-00-00T00:00:00.000Z";
  auto put = [&out](size_t at, int64_t v, int width) {
    for (int i = width - 1; i >= 0; --i, v /= 10)
      out[at + static_cast<size_t>(i)] = static_cast<char>('0' + v % 10);
  };
  put(0, year, 4);
  put(5, month, 2);
  put(8, day, 2);
  put(11, sod / 3600, 2);
  put(14, sod / 60 % 60, 2);
  put(17, sod % 60, 2);
  put(20, milli, 3);
  return out;
}

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const TimeSource& TimeSource::Real() {
  static const TimeSource real;
  return real;
}

std::chrono::system_clock::time_point UnixTime(int64_t sec, int64_t nsec) {
  constexpr int64_t kMaxSeconds = std::numeric_limits<int64_t>::max() / 1'000'000'000 - 1;
  sec = std::clamp<int64_t>(sec, -kMaxSeconds, kMaxSeconds);
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(sec) + std::chrono::nanoseconds(nsec)));
}

}  // namespace sluice
