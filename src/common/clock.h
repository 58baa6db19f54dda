// Time formatting shared by the APIs.
#pragma once

#include <chrono>
#include <string>

namespace sluice {

// ISO 8601 in UTC with microseconds: "2026-11-29T17:25:50.123456+00:00".
std::string FormatIso8601(std::chrono::system_clock::time_point tp);

// Seconds on a monotonic clock, for durations.
double MonotonicSeconds();

}  // namespace sluice
