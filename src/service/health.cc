#include "service/health.h"

#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace sluice {

HealthMonitor::HealthMonitor(StorageService* svc, Options opts) : svc_(svc), opts_(opts) {}

HealthMonitor::~HealthMonitor() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void HealthMonitor::Start() {
  const auto volumes = svc_->Volumes();
  for (Volume* v : volumes) {
    threads_.emplace_back([this, v] { Loop(v); });
    pthread_setname_np(threads_.back().native_handle(), "health");
  }
  // A volume that hangs shows as unavailable once its check has been out for stall_after:
  // waited for from when each check began, not from here (a thread that starts late, on a
  // loaded machine, would otherwise leave its volume out of the first snapshots), and for at
  // most a second more than stall_after in all.
  std::unique_lock lk(mu_);
  auto settled = [&] {
    for (Volume* v : volumes) {
      if (results_.count(v->name())) continue;
      auto it = checking_.find(v->name());
      if (it == checking_.end() || opts_.time->Now() - it->second <= opts_.stall_after)
        return false;
    }
    return true;
  };
  const auto until = std::chrono::steady_clock::now() + opts_.stall_after + std::chrono::seconds(1);
  while (!settled() && std::chrono::steady_clock::now() < until)
    cv_.wait_for(lk, std::chrono::milliseconds(10));  // checks that end notify; stalls do not
}

VolumeHealth HealthMonitor::Judge(const HwInfo& hw, const Result<FsUsage>& fs) {
  VolumeHealth h;
  h.status = hw.status;
  h.info = hw.status_info;
  h.checked_at = std::chrono::system_clock::now();
  if (h.status == "unavailable") return h;
  if (!fs.ok()) {
    h.status = "degraded";
    h.info = fmt::format("cannot read the file system's usage: {}", fs.status().message());
    return h;
  }
  h.fs = *fs;
  const uint64_t reserve = std::min<uint64_t>(fs->capacity_bytes / 100, 1ull << 30);
  if (fs->capacity_bytes > 0 && fs->available_bytes < reserve) {
    h.status = "degraded";
    h.info = fmt::format("the file system is full: {} bytes free of {}", fs->available_bytes,
                         fs->capacity_bytes);
  }
  return h;
}

std::string HealthMonitor::Checking() const {
  std::lock_guard lk(mu_);
  return checking_.empty() ? std::string() : checking_.begin()->first;
}

void HealthMonitor::CheckOne(Volume* v) {
  {
    std::lock_guard lk(mu_);
    checking_[v->name()] = opts_.time->Now();
  }
  VolumeHealth h = Judge(v->GetHwInfo(), v->GetFsUsage());
  {
    std::lock_guard lk(mu_);
    auto& prev = results_[v->name()];
    if (prev.status != h.status)
      spdlog::log(h.status == "healthy" ? spdlog::level::info : spdlog::level::warn,
                  "volume {} is {}{}{}", v->name(), h.status, h.info.empty() ? "" : ": ", h.info);
    prev = std::move(h);
    checking_.erase(v->name());
  }
  cv_.notify_all();
}

void HealthMonitor::CheckAll() {
  for (Volume* v : svc_->Volumes()) CheckOne(v);
}

void HealthMonitor::Loop(Volume* v) {
  std::unique_lock lk(mu_);
  while (!stop_) {
    lk.unlock();
    CheckOne(v);
    lk.lock();
    cv_.wait_for(lk, opts_.interval, [this] { return stop_; });
  }
}

HealthSnapshot HealthMonitor::Snapshot() const {
  HealthSnapshot s;
  {
    std::lock_guard lk(mu_);
    s.volumes = results_;
    const auto now = opts_.time->Now();
    for (const auto& [name, since] : checking_) {
      auto stalled = now - since;
      if (stalled > opts_.stall_after) {
        auto& v = s.volumes[name];
        v.status = "unavailable";
        v.info = fmt::format("the volume has not answered a health check for {} s",
                             std::chrono::duration_cast<std::chrono::seconds>(stalled).count());
      }
    }
  }
  for (const auto& [name, v] : s.volumes) {
    if (v.status == "unavailable")
      s.overall = "unhealthy";
    else if (v.status == "degraded" && s.overall == "healthy")
      s.overall = "degraded";
  }
  return s;
}

}  // namespace sluice
