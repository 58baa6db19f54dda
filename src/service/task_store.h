// The history of background tasks, kept in an SQLite database in the state directory, so that a
// client polling /bgtask after a restart of sluiced still gets the task's outcome. Tasks that
// were pending or running when their process stopped are recorded as failed ("interrupted")
// when the store is next opened: their work did not finish and nothing will resume it.
//
// Several processes may share a state directory. Each row names the process that runs the task
// (an owner id), and each open store holds an exclusive lock on `<path>.owners/<owner id>` for
// as long as it lives; the lock dies with the process, kill -9 included. Only tasks whose owner's
// lock can be taken are marked interrupted, so a starting process leaves its peers' running
// tasks alone.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/owner_locks.h"
#include "common/status.h"
#include "service/bgtask.h"

struct sqlite3;

namespace sluice {

class TaskStore {
 public:
  // Opens (creating) the database at `path`. A file that is not a usable database (corrupt,
  // not SQLite) is moved aside to `<path>.corrupt-<unix time>` with a warning and a new one is
  // made: the history is worth less than a daemon that starts. Other failures (permissions, a
  // full disk) are errors.
  static Result<std::unique_ptr<TaskStore>> Open(const std::string& path);
  ~TaskStore();
  TaskStore(const TaskStore&) = delete;
  TaskStore& operator=(const TaskStore&) = delete;

  // Inserts or replaces the task's row; `durable`: synced before it returns (else a power loss
  // may forget the last rows, see Open).
  Status Put(const BgTaskInfo& task, bool durable = false);
  Status Erase(const std::string& id);
  // Every task, oldest first (by creation). Pending and running ones of owners that are gone are
  // first marked failed (interrupted); `interrupted`, when given, receives their ids.
  Result<std::vector<BgTaskInfo>> LoadAfterRestart(std::vector<std::string>* interrupted = nullptr);
  // One task, whoever runs it (another process sharing the state directory, say).
  Result<std::optional<BgTaskInfo>> Get(const std::string& id);

 private:
  explicit TaskStore(sqlite3* db) : db_(db) {}

  Status MarkInterrupted(const std::string& owner, std::vector<std::string>* ids);
  Status Exec(const char* sql, int* rc = nullptr);
  struct Stmt;
  Status Prepare(Stmt& q, const char* sql, const char* what);
  Status Error(const char* what) const;

  std::mutex mu_;  // one connection, used from task threads and the manager API
  sqlite3* db_;
  std::unique_ptr<OwnerLocks> owners_;  // <path>.owners: this process's lock, its peers' files
};

}  // namespace sluice
