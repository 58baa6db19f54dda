#include "service/bgtask.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/secrets.h"
#include "service/task_store.h"

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
  if (!progress.is_null()) j["progress"] = progress;
  if (state == TaskState::kFailed)
    j["error"] = {
        {"msg", error.message()}, {"errno", error.sys_errno()}, {"code", CodeName(error.code())}};
  return j;
}

BgTaskManager::BgTaskManager(ThreadPool* pool, size_t keep_finished)
    : pool_(pool), keep_finished_(keep_finished) {}

BgTaskManager::~BgTaskManager() = default;

Status BgTaskManager::Persist(std::unique_ptr<TaskStore> store) {
  std::vector<std::string> cut;
  SLUICE_ASSIGN_OR_RETURN(std::vector<BgTaskInfo> history, store->LoadAfterRestart(&cut));
  for (const auto& t : history)
    if (std::find(cut.begin(), cut.end(), t.id) != cut.end()) interrupted_.push_back(t);
  // Finished ones in the order they finished, so that pruning drops the oldest first.
  std::stable_sort(history.begin(), history.end(), [](const BgTaskInfo& a, const BgTaskInfo& b) {
    return a.finished < b.finished;
  });
  std::vector<std::string> dropped;
  size_t kept;
  {
    std::lock_guard lk(mu_);
    store_ = std::move(store);
    for (auto& t : history) {
      finished_order_.push_back(t.id);
      tasks_[t.id] = std::move(t);
    }
    dropped = Prune();
    kept = tasks_.size();
  }
  Forget(dropped);
  spdlog::info("task history: {} tasks from before this start", kept);
  return Status::Ok();
}

void BgTaskManager::Save(const BgTaskInfo& info) {
  if (!store_) return;
  if (Status st = store_->Put(info); !st.ok())
    spdlog::warn("bgtask {}: not recorded in the task history: {}", info.id, st.ToString());
}

void BgTaskManager::Forget(const std::vector<std::string>& ids) {
  if (!store_) return;
  for (const auto& id : ids)
    if (Status st = store_->Erase(id); !st.ok())
      spdlog::warn("bgtask {}: not removed from the task history: {}", id, st.ToString());
}

Result<std::string> BgTaskManager::Start(std::string kind, nlohmann::json params, Fn fn) {
  return Start(std::move(kind), std::move(params),
               ReportingFn([fn = std::move(fn)](const Report&) { return fn(); }));
}

Result<std::string> BgTaskManager::Start(std::string kind, nlohmann::json params, ReportingFn fn) {
  return Start(
      std::move(kind), std::move(params),
      CheckpointingFn([fn = std::move(fn)](const Report& r, const Checkpoint&) { return fn(r); }));
}

Result<std::string> BgTaskManager::Start(std::string kind, nlohmann::json params,
                                         CheckpointingFn fn) {
  std::string hex = RandomHexString(16);
  std::string id = hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
                   hex.substr(16, 4) + "-" + hex.substr(20, 12);
  BgTaskInfo info;
  info.id = id;
  info.kind = kind;
  info.params = std::move(params);
  info.created = std::chrono::system_clock::now();
  Save(info);  // before the task can run: its later states are written after this one
  {
    std::lock_guard lk(mu_);
    tasks_[id] = std::move(info);
    ++active_;
  }
  bool queued = pool_->Submit([this, id, kind, fn = std::move(fn)] {
    BgTaskInfo running;
    {
      std::lock_guard lk(mu_);
      auto& t = tasks_[id];
      t.state = TaskState::kRunning;
      t.started = std::chrono::system_clock::now();
      running = t;
    }
    Save(running);
    Status st;
    const Report report = [this, &id](nlohmann::json p) {
      std::lock_guard lk(mu_);
      tasks_[id].progress = std::move(p);
    };
    const Checkpoint checkpoint = [this, &id](nlohmann::json p) -> Status {
      BgTaskInfo now;
      {
        std::lock_guard lk(mu_);
        tasks_[id].params = std::move(p);
        now = tasks_[id];
      }
      return store_ ? store_->Put(now, /*durable=*/true) : Status::Ok();
    };
    try {
      st = fn(report, checkpoint);
    } catch (const std::exception& e) {
      st = Status(Code::kInternal, std::string("unexpected exception: ") + e.what());
    }
    if (!st.ok())
      spdlog::warn("bgtask {} ({}) failed: {}", id, kind, st.ToString());
    else
      spdlog::info("bgtask {} ({}) completed", id, kind);
    BgTaskInfo done;
    std::vector<std::string> dropped;
    {
      std::lock_guard lk(mu_);
      auto& t = tasks_[id];
      t.state = st.ok() ? TaskState::kCompleted : TaskState::kFailed;
      t.error = st;
      t.finished = std::chrono::system_clock::now();
      finished_order_.push_back(id);
      done = t;
      dropped = Prune();
    }
    // Recorded before WaitIdle can return: a stop after the task sees it finished.
    Save(done);
    Forget(dropped);
    std::lock_guard lk(mu_);
    if (--active_ == 0) idle_cv_.notify_all();
  });
  if (!queued) {
    {
      std::lock_guard lk(mu_);
      tasks_.erase(id);
      if (--active_ == 0) idle_cv_.notify_all();
    }
    Forget({id});
    return Status(Code::kUnavailable, "background task queue is full or shutting down");
  }
  return id;
}

std::vector<std::string> BgTaskManager::Prune() {
  std::vector<std::string> dropped;
  if (finished_order_.size() <= keep_finished_) return dropped;
  size_t n = finished_order_.size() - keep_finished_;
  dropped.assign(finished_order_.begin(), finished_order_.begin() + n);
  finished_order_.erase(finished_order_.begin(), finished_order_.begin() + n);
  for (const auto& id : dropped) tasks_.erase(id);
  return dropped;
}

std::optional<BgTaskInfo> BgTaskManager::Get(const std::string& id) const {
  {
    std::lock_guard lk(mu_);
    auto it = tasks_.find(id);
    if (it != tasks_.end()) return it->second;
  }
  // Not one of ours: another process sharing the state directory may run it.
  if (!store_) return std::nullopt;
  auto t = store_->Get(id);
  if (!t.ok()) {
    spdlog::warn("bgtask {}: task history: {}", id, t.status().ToString());
    return std::nullopt;
  }
  return *t;
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
