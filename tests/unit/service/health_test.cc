#include "service/health.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

FsUsage Fs(uint64_t capacity, uint64_t available) {
  FsUsage f;
  f.capacity_bytes = capacity;
  f.available_bytes = available;
  f.used_bytes = capacity - available;
  return f;
}

TEST(Health, FullFileSystemIsDegradedWithTheFigures) {
  constexpr uint64_t kGiB = 1ull << 30;
  HwInfo ok;
  EXPECT_EQ(HealthMonitor::Judge(ok, Fs(100 * kGiB, 50 * kGiB)).status, "healthy");
  // Large: under 1 GiB free is full; small: under 1 % is.
  VolumeHealth big = HealthMonitor::Judge(ok, Fs(1000 * kGiB, kGiB / 2));
  EXPECT_EQ(big.status, "degraded");
  EXPECT_NE(big.info.find("full"), std::string::npos);
  EXPECT_NE(big.info.find(std::to_string(kGiB / 2)), std::string::npos);
  EXPECT_EQ(HealthMonitor::Judge(ok, Fs(1000 * kGiB, 2 * kGiB)).status, "healthy");
  EXPECT_EQ(HealthMonitor::Judge(ok, Fs(8 << 20, 0)).status, "degraded");
  EXPECT_EQ(HealthMonitor::Judge(ok, Fs(8 << 20, 1 << 20)).status, "healthy");
}

TEST(Health, BackendVerdictAndFailedChecks) {
  HwInfo gone;
  gone.status = "unavailable";
  gone.status_info = "volume path '/x' is not reachable";
  VolumeHealth h = HealthMonitor::Judge(gone, Status(Code::kIoError, "statvfs: EIO"));
  EXPECT_EQ(h.status, "unavailable");
  EXPECT_EQ(h.info, gone.status_info);
  VolumeHealth failing = HealthMonitor::Judge(HwInfo(), Status(Code::kIoError, "statvfs: EIO"));
  EXPECT_EQ(failing.status, "degraded");
  EXPECT_NE(failing.info.find("statvfs: EIO"), std::string::npos);
}

}  // namespace
}  // namespace sluice
