#include "service/janitor.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace sluice {

Janitor::Janitor(StorageService* svc) : svc_(svc), uploads_(svc) {
  auto expire = std::chrono::duration_cast<std::chrono::milliseconds>(svc->config().session_expire);
  interval_ = std::clamp(expire / 4, std::chrono::milliseconds(1000),
                         std::chrono::milliseconds(std::chrono::minutes(10)));
}

Janitor::~Janitor() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Janitor::Start() {
  thread_ = std::thread([this] { Loop(); });
  pthread_setname_np(thread_.native_handle(), "janitor");
}

void Janitor::AddChore(std::string name, std::function<void()> chore) {
  chores_.emplace_back(std::move(name), std::move(chore));
}

void Janitor::RunOnce() {
  for (Volume* v : svc_->Volumes()) {
    Status st = v->EmptyTrash();
    if (!st.ok())
      spdlog::error("volume {}: cannot empty the trash (retried in {} s): {}", v->name(),
                    std::chrono::duration_cast<std::chrono::seconds>(interval_).count(),
                    st.ToString());
  }
  try {
    uploads_.SweepAll();
  } catch (const std::exception& e) {
    spdlog::error("upload sweep failed: {}", e.what());
  }
  for (const auto& [name, chore] : chores_) {
    try {
      chore();
    } catch (const std::exception& e) {
      spdlog::error("{} failed (retried next round): {}", name, e.what());
    }
  }
}

void Janitor::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    lk.unlock();
    RunOnce();
    lk.lock();
    cv_.wait_for(lk, interval_, [this] { return stop_; });
  }
}

}  // namespace sluice
