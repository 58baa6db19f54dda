// Time formatting: the S3 listing's hand-written ISO 8601 against gmtime.
#include "common/clock.h"

#include <gtest/gtest.h>

#include <ctime>
#include <random>

#include <fmt/format.h>

namespace sluice {
namespace {

std::string ViaGmtime(int64_t ms) {
  int64_t secs = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
  std::time_t t = static_cast<std::time_t>(secs);
  struct tm tm;
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms - secs * 1000);
}

std::chrono::system_clock::time_point AtMs(int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

TEST(Clock, Iso8601MillisAgreesWithGmtime) {
  EXPECT_EQ(FormatIso8601Millis(AtMs(0)), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(FormatIso8601Millis(AtMs(1796184952123)), "2026-12-02T04:15:52.123Z");
  EXPECT_EQ(FormatIso8601Millis(AtMs(-1)), "1969-12-31T23:59:59.999Z");
  EXPECT_EQ(FormatIso8601Millis(AtMs(951782400000)), "2000-02-29T00:00:00.000Z");  // leap day
  // Sub-millisecond parts are floored, not rounded.
  EXPECT_EQ(FormatIso8601Millis(AtMs(5) + std::chrono::microseconds(999)),
            "1970-01-01T00:00:00.005Z");
  std::mt19937_64 rng(42);
  // All a system_clock time point holds (nanoseconds in 64 bits: 1678 to 2262).
  std::uniform_int_distribution<int64_t> any(-9'000'000'000'000, 9'000'000'000'000);
  for (int i = 0; i < 20000; ++i) {
    int64_t ms = any(rng);
    ASSERT_EQ(FormatIso8601Millis(AtMs(ms)), ViaGmtime(ms)) << ms;
  }
}

TEST(Clock, UnixTimesPastTheClocksRangeAreClampedNotWrapped) {
  using namespace std::chrono;
  EXPECT_EQ(duration_cast<seconds>(UnixTime(1'700'000'000, 5).time_since_epoch()).count(),
            1'700'000'000);
  // 2400-01-01 overflows nanoseconds since 1970: it stays after now, not in 1815.
  const auto far = UnixTime(13'569'465'600, 0);
  EXPECT_GT(far, system_clock::now());
  EXPECT_LT(UnixTime(-13'569'465'600, 0), system_clock::time_point{});
}

}  // namespace
}  // namespace sluice
