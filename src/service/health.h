// The node's health, kept current in the background so that probes (/health, /readyz) answer
// at once from memory and never queue behind file work: a volume's check (stat, statvfs) runs
// every interval on a thread of the monitor's for that volume, so that one volume that hangs
// does not keep the others' figures from being checked.
//
// A volume is
//   unavailable  when its path cannot be reached, or its check has not come back for
//                `stall_after` (a hung mount);
//   degraded     when its backend says so (not writable, no quota support...), when its file
//                system is full (less free than min(1 % of capacity, 1 GiB)), or when the check
//                itself failed (statvfs errors);
//   healthy      otherwise.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "service/storage_service.h"

namespace sluice {

struct VolumeHealth {
  std::string status = "healthy";  // healthy | degraded | unavailable
  std::string info;                // why, when not healthy
  std::optional<FsUsage> fs;       // the last statvfs figures
  std::chrono::system_clock::time_point checked_at;
};

struct HealthSnapshot {
  std::map<std::string, VolumeHealth> volumes;
  // "healthy", "degraded" (some volume is) or "unhealthy" (some volume is unavailable).
  std::string overall = "healthy";
};

class HealthMonitor {
 public:
  struct Options {
    std::chrono::milliseconds interval{2000};
    std::chrono::milliseconds stall_after{10000};
    const TimeSource* time = &TimeSource::Real();  // tests move a ManualTime instead
  };
  HealthMonitor(StorageService* svc, Options opts);
  explicit HealthMonitor(StorageService* svc) : HealthMonitor(svc, Options()) {}
  ~HealthMonitor();

  // Starts a checking thread per volume and waits for every volume's first check, or for its
  // check to have been out for stall_after (at most a second more in all), so that the first
  // probe has an answer for each.
  void Start();
  // Checks every volume now, on the caller's thread.
  void CheckAll();
  // The last results; a check that has been running for longer than stall_after shows as
  // unavailable. Never blocks on a volume.
  HealthSnapshot Snapshot() const;
  // A volume whose check is out now ("" when none).
  std::string Checking() const;

  // The verdict for one volume's figures (exposed for tests).
  static VolumeHealth Judge(const HwInfo& hw, const Result<FsUsage>& fs);

 private:
  void Loop(Volume* v);
  void CheckOne(Volume* v);

  StorageService* svc_;
  Options opts_;
  mutable std::mutex mu_;
  std::map<std::string, VolumeHealth> results_;
  // The volumes being checked right now, and since when.
  std::map<std::string, std::chrono::steady_clock::time_point> checking_;
  std::condition_variable cv_;  // stop_, and each check that comes back
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace sluice
