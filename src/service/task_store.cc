#include "service/task_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace sluice {

namespace {

using SysTime = std::chrono::system_clock::time_point;

// Times are kept as whole microseconds since the epoch: exact for what the API shows.
int64_t ToMicros(SysTime t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

SysTime FromMicros(int64_t us) {
  return SysTime(std::chrono::duration_cast<SysTime::duration>(std::chrono::microseconds(us)));
}

constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS tasks ("
    " id TEXT PRIMARY KEY, kind TEXT NOT NULL, params TEXT NOT NULL, state INTEGER NOT NULL,"
    " error_code INTEGER NOT NULL DEFAULT 0, error_msg TEXT NOT NULL DEFAULT '',"
    " error_errno INTEGER NOT NULL DEFAULT 0,"
    " created INTEGER NOT NULL, started INTEGER NOT NULL DEFAULT 0,"
    " finished INTEGER NOT NULL DEFAULT 0, owner TEXT NOT NULL DEFAULT '')";

bool IsNotADatabase(int rc) {
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

}  // namespace

// A prepared statement, finalized on every path, with its parameters bound by position.
struct TaskStore::Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
  void Text(int i, std::string_view v) {
    sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void Int(int i, int64_t v) { sqlite3_bind_int64(s, i, v); }
};

Status TaskStore::Error(const char* what) const {
  return Status(Code::kInternal, fmt::format("task history: {}: {}", what, sqlite3_errmsg(db_)));
}

Status TaskStore::Prepare(Stmt& q, const char* sql, const char* what) {
  if (sqlite3_prepare_v2(db_, sql, -1, &q.s, nullptr) != SQLITE_OK) return Error(what);
  return Status::Ok();
}

Status TaskStore::Exec(const char* sql, int* rc_out) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  if (rc_out) *rc_out = rc;
  std::string msg = err ? err : sqlite3_errstr(rc);
  sqlite3_free(err);
  if (rc != SQLITE_OK) return Status(Code::kInternal, fmt::format("task history: {}", msg));
  return Status::Ok();
}

Result<std::unique_ptr<TaskStore>> TaskStore::Open(const std::string& path) {
  // Processes starting together open (and, when it is corrupt, replace) the file one at a time.
  auto guard = LockFileExclusive(path + ".lock");
  if (!guard.ok()) return guard.status().WithContext("task history");
  for (int attempt = 0;; ++attempt) {
    sqlite3* db = nullptr;
    int rc =
        sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    std::unique_ptr<TaskStore> store(db ? new TaskStore(db) : nullptr);
    if (rc != SQLITE_OK) {
      std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
      return Status(Code::kInternal, fmt::format("task history '{}': {}", path, msg));
    }
    sqlite3_busy_timeout(db, 5000);
    // WAL with synchronous=NORMAL: a state change costs no fsync; a power loss may forget the
    // last changes, never corrupt the file.
    int erc = SQLITE_OK;
    Status st = store->Exec("PRAGMA journal_mode=WAL", &erc);
    if (st.ok()) st = store->Exec("PRAGMA synchronous=NORMAL", &erc);
    if (st.ok()) st = store->Exec(kSchema, &erc);
    if (st.ok()) st = store->Exec("SELECT count(*) FROM tasks", &erc);
    if (st.ok()) {
      auto owners = OwnerLocks::Open(path + ".owners");
      if (!owners.ok()) return owners.status().WithContext("task history");
      store->owners_ = std::move(owners).value();
      return store;
    }
    if (!IsNotADatabase(erc) || attempt > 0)
      return Status(Code::kInternal, fmt::format("'{}': {}", path, st.message()));
    store.reset();
    std::string aside = fmt::format("{}.corrupt-{}", path, std::time(nullptr));
    spdlog::warn("task history '{}' is not a usable database ({}); moved to '{}', starting anew",
                 path, st.message(), aside);
    SLUICE_RETURN_IF_ERROR(MoveDatabaseAside(path, aside));
  }
}

TaskStore::~TaskStore() {
  sqlite3_close_v2(db_);
  // owners_ goes after the database: a clean close removes this process's owner file.
}

// Marks the unfinished tasks of `owner` failed, if its process is gone.
Status TaskStore::MarkInterrupted(const std::string& owner, std::vector<std::string>* ids) {
  SLUICE_ASSIGN_OR_RETURN(auto claim, owners_->ClaimIfGone(owner));
  if (!claim) return Status::Ok();  // alive: its tasks are its own business
  // No lock file (removed after a clean close) or a lock taken (its process is gone).
  if (ids) {
    Stmt q;
    SLUICE_RETURN_IF_ERROR(
        Prepare(q, "SELECT id FROM tasks WHERE owner = ? AND state IN (?, ?)", "prepare select"));
    q.Text(1, owner);
    q.Int(2, static_cast<int>(TaskState::kPending));
    q.Int(3, static_cast<int>(TaskState::kRunning));
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
      const unsigned char* p = sqlite3_column_text(q.s, 0);
      ids->emplace_back(p ? reinterpret_cast<const char*>(p) : "");
    }
    if (rc != SQLITE_DONE) return Error("read interrupted tasks");
  }
  Stmt q;
  SLUICE_RETURN_IF_ERROR(Prepare(q,
                                 "UPDATE tasks SET state = ?, error_code = ?, error_msg = ?, "
                                 "error_errno = ?, finished = ?, started = CASE WHEN started = 0 "
                                 "THEN ? ELSE started END WHERE owner = ? AND state IN (?, ?)",
                                 "prepare update"));
  const int64_t now = ToMicros(std::chrono::system_clock::now());
  static const char kWhy[] =
      "interrupted: sluiced stopped before the task finished; its work may be partly done";
  q.Int(1, static_cast<int>(TaskState::kFailed));
  q.Int(2, static_cast<int>(Code::kUnavailable));
  q.Text(3, kWhy);
  q.Int(4, EINTR);
  q.Int(5, now);
  q.Int(6, now);
  q.Text(7, owner);
  q.Int(8, static_cast<int>(TaskState::kPending));
  q.Int(9, static_cast<int>(TaskState::kRunning));
  int rc = sqlite3_step(q.s);
  if (rc != SQLITE_DONE) return Error("mark interrupted tasks");
  claim->Done();
  return Status::Ok();
}

Status TaskStore::Put(const BgTaskInfo& t, bool durable) {
  std::lock_guard lk(mu_);
  if (durable) SLUICE_RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL"));
  // (Back to NORMAL whatever the insert did.)
  struct Normal {
    TaskStore* s;
    bool on;
    ~Normal() {
      if (on) (void)s->Exec("PRAGMA synchronous=NORMAL");
    }
  } normal{this, durable};
  Stmt q;
  SLUICE_RETURN_IF_ERROR(
      Prepare(q,
              "INSERT OR REPLACE INTO tasks (id, kind, params, state, error_code, "
              "error_msg, error_errno, created, started, finished, owner) "
              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
              "prepare insert"));
  std::string params = t.params.dump();
  std::string msg = t.error.message();
  q.Text(1, t.id);
  q.Text(2, t.kind);
  q.Text(3, params);
  q.Int(4, static_cast<int>(t.state));
  q.Int(5, static_cast<int>(t.error.code()));
  q.Text(6, msg);
  q.Int(7, t.error.ok() ? 0 : t.error.sys_errno());
  q.Int(8, ToMicros(t.created));
  q.Int(9, ToMicros(t.started));
  q.Int(10, ToMicros(t.finished));
  q.Text(11, owners_->self());
  if (sqlite3_step(q.s) != SQLITE_DONE) return Error("insert");
  return Status::Ok();
}

Status TaskStore::Erase(const std::string& id) {
  std::lock_guard lk(mu_);
  Stmt q;
  SLUICE_RETURN_IF_ERROR(Prepare(q, "DELETE FROM tasks WHERE id = ?", "prepare delete"));
  q.Text(1, id);
  if (sqlite3_step(q.s) != SQLITE_DONE) return Error("delete");
  return Status::Ok();
}

namespace {

constexpr const char* kColumns =
    "id, kind, params, state, error_code, error_msg, error_errno, created, started, finished";

// A row of kColumns.
BgTaskInfo RowToTask(sqlite3_stmt* q) {
  auto text = [q](int col) {
    const unsigned char* p = sqlite3_column_text(q, col);
    return std::string(p ? reinterpret_cast<const char*>(p) : "");
  };
  BgTaskInfo t;
  t.id = text(0);
  t.kind = text(1);
  t.params = nlohmann::json::parse(text(2), nullptr, /*allow_exceptions=*/false);
  if (t.params.is_discarded()) t.params = nlohmann::json::object();
  int state = sqlite3_column_int(q, 3);
  t.state = state >= 0 && state <= static_cast<int>(TaskState::kFailed)
                ? static_cast<TaskState>(state)
                : TaskState::kFailed;
  if (t.state == TaskState::kFailed) {
    int code = sqlite3_column_int(q, 4);
    std::string msg = text(5);
    if (code <= static_cast<int>(Code::kOk) || code > static_cast<int>(Code::kInternal))
      code = static_cast<int>(Code::kInternal);
    t.error =
        Status(static_cast<Code>(code), msg.empty() ? "failed" : msg, sqlite3_column_int(q, 6));
  }
  t.created = FromMicros(sqlite3_column_int64(q, 7));
  t.started = FromMicros(sqlite3_column_int64(q, 8));
  t.finished = FromMicros(sqlite3_column_int64(q, 9));
  return t;
}

}  // namespace

Result<std::vector<BgTaskInfo>> TaskStore::LoadAfterRestart(std::vector<std::string>* interrupted) {
  std::lock_guard lk(mu_);
  std::vector<std::string> owners;
  {
    Stmt q;
    SLUICE_RETURN_IF_ERROR(Prepare(
        q, "SELECT DISTINCT owner FROM tasks WHERE state IN (?, ?) AND owner != ?", "prepare"));
    q.Int(1, static_cast<int>(TaskState::kPending));
    q.Int(2, static_cast<int>(TaskState::kRunning));
    q.Text(3, owners_->self());
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
      const unsigned char* p = sqlite3_column_text(q.s, 0);
      owners.emplace_back(p ? reinterpret_cast<const char*>(p) : "");
    }
    if (rc != SQLITE_DONE) return Error("read owners");
  }
  // Owner files with no unfinished tasks too: those of processes that ended without closing
  // their store (sluiced exits with _Exit) are removed here rather than piling up.
  for (auto& name : owners_->Others())
    if (std::find(owners.begin(), owners.end(), name) == owners.end()) owners.push_back(name);
  for (const auto& o : owners) SLUICE_RETURN_IF_ERROR(MarkInterrupted(o, interrupted));
  // Finished tasks only: those of a live peer are read from the store when asked for (Get).
  Stmt q;
  SLUICE_RETURN_IF_ERROR(Prepare(
      q,
      fmt::format("SELECT {} FROM tasks WHERE state IN (?, ?) ORDER BY created", kColumns).c_str(),
      "prepare select"));
  q.Int(1, static_cast<int>(TaskState::kCompleted));
  q.Int(2, static_cast<int>(TaskState::kFailed));
  std::vector<BgTaskInfo> out;
  int rc;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) out.push_back(RowToTask(q.s));
  if (rc != SQLITE_DONE) return Error("read");
  return out;
}

Result<std::optional<BgTaskInfo>> TaskStore::Get(const std::string& id) {
  std::lock_guard lk(mu_);
  Stmt q;
  SLUICE_RETURN_IF_ERROR(Prepare(
      q, fmt::format("SELECT {} FROM tasks WHERE id = ?", kColumns).c_str(), "prepare select"));
  q.Text(1, id);
  int rc = sqlite3_step(q.s);
  if (rc == SQLITE_ROW) return std::optional<BgTaskInfo>(RowToTask(q.s));
  if (rc != SQLITE_DONE) return Error("read");
  return std::optional<BgTaskInfo>();
}

}  // namespace sluice
