#include "service/health.h"

#include <gtest/gtest.h>

#include <thread>

#include "support/assert_status.h"
#include "volume/registry.h"

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

// A volume whose check hangs (a dead NFS server, say) shows as unavailable once the check has
// been out for stall_after, with the reason; the monitor's clock is moved by hand, not slept.
// An in-memory volume `name`, served as sluiced serves volumes; its statvfs takes `latency`
// ("" for none).
Status AddMemVolume(std::vector<std::unique_ptr<Volume>>& vols, const std::string& name,
                    const std::string& latency) {
  VolumeConfig vc;
  vc.name = name;
  vc.backend = "mem";
  vc.path = "mem";
  if (!latency.empty())
    vc.faults = nlohmann::json::array({{{"op", "fs-usage"}, {"latency", latency}}});
  auto v = VolumeRegistry::Builtin().CreateServed(vc, VolumeDeps{});
  if (!v.ok()) return v.status();
  vols.push_back(std::move(v).value());
  return Status::Ok();
}

TEST(Health, AHungCheckMakesTheVolumeUnavailable) {
  std::vector<std::unique_ptr<Volume>> vols;
  ASSERT_OK(AddMemVolume(vols, "hung", "1s"));
  Config cfg;
  ThreadPool tasks("t", 1);
  StorageService svc(cfg, std::move(vols), &tasks);
  ManualTime time;
  HealthMonitor::Options o;
  o.stall_after = std::chrono::seconds(10);
  o.time = &time;
  HealthMonitor m(&svc, o);
  std::thread check([&] { m.CheckAll(); });  // takes 1 s of real time
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (m.Checking().empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(m.Checking(), "hung");             // (EXPECT: the thread is joined below either way)
  EXPECT_EQ(m.Snapshot().overall, "healthy");  // out for 0 s by the monitor's clock
  time.Advance(std::chrono::seconds(11));
  HealthSnapshot s = m.Snapshot();
  EXPECT_EQ(s.overall, "unhealthy");
  EXPECT_EQ(s.volumes["hung"].status, "unavailable");
  EXPECT_NE(s.volumes["hung"].info.find("has not answered a health check for 11 s"),
            std::string::npos)
      << s.volumes["hung"].info;
  check.join();
  EXPECT_EQ(m.Snapshot().overall, "healthy");  // the check came back
}

// One volume that hangs does not hold the others' checks: each volume has its own thread.
// Before, the checks ran one after another, so "ok" was checked once per hung round (3 s).
TEST(Health, AHungVolumeDoesNotHoldTheOthersChecks) {
  std::vector<std::unique_ptr<Volume>> vols;
  ASSERT_OK(AddMemVolume(vols, "hung", "3s"));
  ASSERT_OK(AddMemVolume(vols, "ok", ""));
  Config cfg;
  ThreadPool tasks("t", 1);
  StorageService svc(cfg, std::move(vols), &tasks);
  HealthMonitor::Options o;
  o.interval = std::chrono::milliseconds(20);
  o.stall_after = std::chrono::milliseconds(300);
  HealthMonitor m(&svc, o);
  m.Start();  // waits at most stall_after for the hung one
  HealthSnapshot first = m.Snapshot();
  EXPECT_EQ(first.volumes["hung"].status, "unavailable");
  ASSERT_EQ(first.volumes.count("ok"), 1u);
  EXPECT_EQ(first.volumes["ok"].status, "healthy");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  HealthSnapshot later = m.Snapshot();
  EXPECT_GT(later.volumes["ok"].checked_at, first.volumes["ok"].checked_at)
      << "the healthy volume was not checked again while the other hung";
  EXPECT_EQ(later.overall, "unhealthy");
}

}  // namespace
}  // namespace sluice
