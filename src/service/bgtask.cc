#include "service/bgtask.h"

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/secrets.h"

namespace sluice {

std::string_view TaskStateName(TaskState s) {
  switch (s) {
    case TaskState::kPending:
      return "pending";
    case TaskState::kRunning:
      return "running";
    case TaskState::kCompleted:
      return "completed";
    case TaskState::kFailed:
      return "failed";
  }
  return "unknown";
}

nlohmann::json BgTaskInfo::ToJson() const {
  nlohmann::json j = {{"task_id", id},
                      {"kind", kind},
                      {"params", params},
                      {"status", TaskStateName(state)},
                      {"created_at", FormatIso8601(created)},
                      {"started_at", nullptr},
                      {"finished_at", nullptr},
                      {"error", nullptr}};
  if (state != TaskState::kPending) j["started_at"] = FormatIso8601(started);
  if (state == TaskState::kCompleted || state == TaskState::kFailed)
    j["finished_at"] = FormatIso8601(finished);
  if (state == TaskState::kFailed)
    j["error"] = {
        {"msg", error.message()}, {"errno", error.sys_errno()}, {"code", CodeName(error.code())}};
  return j;
}

Result<std::string> BgTaskManager::Start(std::string kind, nlohmann::json params, Fn fn) {
  std::string hex = RandomHexString(16);
  std::string id = hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
                   hex.substr(16, 4) + "-" + hex.substr(20, 12);
  {
    std::lock_guard lk(mu_);
    BgTaskInfo info;
    info.id = id;
    info.kind = kind;
    info.params = std::move(params);
    info.created = std::chrono::system_clock::now();
    tasks_[id] = std::move(info);
    ++active_;
  }
  bool queued = pool_->Submit([this, id, kind, fn = std::move(fn)] {
    {
      std::lock_guard lk(mu_);
      auto& t = tasks_[id];
      t.state = TaskState::kRunning;
      t.started = std::chrono::system_clock::now();
    }
    Status st;
    try {
      st = fn();
    } catch (const std::exception& e) {
      st = Status(Code::kInternal, std::string("unexpected exception: ") + e.what());
    }
    if (!st.ok())
      spdlog::warn("bgtask {} ({}) failed: {}", id, kind, st.ToString());
    else
      spdlog::info("bgtask {} ({}) completed", id, kind);
    std::lock_guard lk(mu_);
    auto& t = tasks_[id];
    t.state = st.ok() ? TaskState::kCompleted : TaskState::kFailed;
    t.error = st;
    t.finished = std::chrono::system_clock::now();
    finished_order_.push_back(id);
    Prune();
    if (--active_ == 0) idle_cv_.notify_all();
  });
  if (!queued) {
    std::lock_guard lk(mu_);
    tasks_.erase(id);
    if (--active_ == 0) idle_cv_.notify_all();
    return Status(Code::kUnavailable, "background task queue is full or shutting down");
  }
  return id;
}

void BgTaskManager::Prune() {
  while (finished_order_.size() > keep_finished_) {
    tasks_.erase(finished_order_.front());
    finished_order_.erase(finished_order_.begin());
  }
}

std::optional<BgTaskInfo> BgTaskManager::Get(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return std::nullopt;
  return it->second;
}

std::vector<BgTaskInfo> BgTaskManager::List() const {
  std::lock_guard lk(mu_);
  std::vector<BgTaskInfo> out;
  for (const auto& [k, v] : tasks_) out.push_back(v);
  return out;
}

bool BgTaskManager::WaitIdle(std::chrono::steady_clock::duration timeout) {
  std::unique_lock lk(mu_);
  return idle_cv_.wait_for(lk, timeout, [this] { return active_ == 0; });
}

}  // namespace sluice
