// Background tasks (vfolder delete and clone, async file delete): each gets an id and a status
// that clients poll. Tasks run on a bounded pool; finished tasks are kept for a while.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/thread_pool.h"

namespace sluice {

enum class TaskState { kPending, kRunning, kCompleted, kFailed };
std::string_view TaskStateName(TaskState s);

class TaskStore;

struct BgTaskInfo {
  std::string id;
  std::string kind;
  nlohmann::json params;
  TaskState state = TaskState::kPending;
  Status error;             // set when failed
  nlohmann::json progress;  // what the task reported last (null: nothing); not persisted
  std::chrono::system_clock::time_point created, started, finished;

  nlohmann::json ToJson() const;
};

class BgTaskManager {
 public:
  using Fn = std::function<Status()>;
  // A task that reports how far it got: `report` replaces the task's `progress`.
  using Report = std::function<void(nlohmann::json)>;
  using ReportingFn = std::function<Status(const Report& report)>;
  // A task that records a step it must not lose: `checkpoint` replaces the task's params and
  // writes them durably (fsync) to the task history before returning, so that what resumes
  // the task after a crash (TakeInterrupted) knows the step was taken.
  using Checkpoint = std::function<Status(nlohmann::json params)>;
  using CheckpointingFn = std::function<Status(const Report& report, const Checkpoint& checkpoint)>;

  explicit BgTaskManager(ThreadPool* pool, size_t keep_finished = 10000);
  ~BgTaskManager();

  // Keeps the task history in `store` from now on, and loads what it holds (tasks cut short by
  // the last stop are failed "interrupted" there). Call before the first Start.
  Status Persist(std::unique_ptr<TaskStore> store);
  // The tasks Persist found cut short by the last stop (once: the list is handed over), for
  // whoever must finish or undo what they began (StorageService::ResumeInterrupted).
  std::vector<BgTaskInfo> TakeInterrupted() { return std::exchange(interrupted_, {}); }

  // Queues `fn`; kUnavailable when the pool refuses it (shutting down or overloaded).
  Result<std::string> Start(std::string kind, nlohmann::json params, Fn fn);
  Result<std::string> Start(std::string kind, nlohmann::json params, ReportingFn fn);
  Result<std::string> Start(std::string kind, nlohmann::json params, CheckpointingFn fn);
  // A task of this process, else (with a store) one from the shared history.
  std::optional<BgTaskInfo> Get(const std::string& id) const;
  std::vector<BgTaskInfo> List() const;
  // Blocks until no task is pending or running, or the deadline passes; true if idle.
  bool WaitIdle(std::chrono::steady_clock::duration timeout);

 private:
  // Drops the oldest finished tasks beyond keep_finished_; returns their ids.
  std::vector<std::string> Prune();
  void Save(const BgTaskInfo& info);
  void Forget(const std::vector<std::string>& ids);

  ThreadPool* pool_;
  size_t keep_finished_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  size_t active_ = 0;
  std::map<std::string, BgTaskInfo> tasks_;
  std::vector<std::string> finished_order_;
  std::unique_ptr<TaskStore> store_;     // null: history in memory only
  std::vector<BgTaskInfo> interrupted_;  // set by Persist, before any task starts
};

}  // namespace sluice
