// Backend.AI's event bus, as far as a storage proxy writes to it: the manager moves a vfolder
// out of CLONING or DELETE_ONGOING only when a vfolder_clone_* / vfolder_deletion_* event
// reaches it as an anycast entry on a Redis stream (XADD <stream> ... name, source, payload).
//
// Delivery is at least once. An event is first appended to an outbox (SQLite, in the state
// directory) and only then handed to a delivery thread, which sends the outbox in order and
// removes what Redis acknowledged. Events survive a bus outage and a restart of sluiced; an
// event acknowledged by Redis but not yet removed when the process dies is sent again.
//
// Where the bus is: `[events] redis-addr`, else the Redis configuration Backend.AI keeps in
// etcd (`/sorna/<namespace>/[nodes/storage/<node-id>/]config/redis/...`), read again after each
// failed connection so that a moved Redis is found.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/status.h"

struct sqlite3;

namespace sluice {

// One anycast event: its name, its body as JSON (the current wire form, field `payload`) and as
// the positional tuple older managers read (field `args`, msgpack).
struct BusEvent {
  std::string name;
  nlohmann::json payload = nlohmann::json::object();
  std::vector<std::string> args;
};

// The four events Backend.AI's storage proxy emits for vfolders. Ids are Backend.AI's text form
// of a VFolderID ("user:<dashed uuid>/<32 hex>").
BusEvent VFolderDeletionSuccess(const std::string& vfid);
BusEvent VFolderDeletionFailure(const std::string& vfid, const std::string& message);
BusEvent VFolderCloneSuccess(const std::string& src_vfid, const std::string& dst_vfid);
BusEvent VFolderCloneFailure(const std::string& src_vfid, const std::string& dst_vfid,
                             const std::string& message);

// Where Redis is, and how to log in.
struct RedisTarget {
  HostPort addr;
  std::string password;
};

// Finds the bus's Redis: the explicit setting, else etcd's shared configuration (the stream
// role's override first, then the node's scope, then the global one; a sentinel set is asked
// for its master).
Result<RedisTarget> LocateRedis(const Config& cfg);

// The rows of the outbox, oldest first, across restarts.
class EventOutbox {
 public:
  static Result<std::unique_ptr<EventOutbox>> Open(const std::string& path);
  ~EventOutbox();
  EventOutbox(const EventOutbox&) = delete;
  EventOutbox& operator=(const EventOutbox&) = delete;

  struct Row {
    int64_t id;
    BusEvent event;
  };
  Status Append(const BusEvent& e);
  Result<std::vector<Row>> Oldest(size_t n);
  Status Remove(int64_t id);
  Result<uint64_t> Count();

 private:
  explicit EventOutbox(sqlite3* db) : db_(db) {}
  Status Exec(const char* sql);
  std::mutex mu_;
  sqlite3* db_;
};

class EventBus {
 public:
  // The outbox lives in `<state_dir>/events.db`.
  static Result<std::unique_ptr<EventBus>> Open(const Config& cfg);
  ~EventBus();

  // Starts the delivery thread (events appended before are sent too: the outbox of the last run).
  void Start();
  // Makes the event durable in the outbox and wakes the delivery thread. Fails only when the
  // outbox cannot be written (the event is then lost; the caller logs it).
  Status Publish(const BusEvent& e);
  // Gives the thread up to `grace` to send what is pending, then stops it. What is left stays in
  // the outbox for the next start.
  void Stop(std::chrono::milliseconds grace);

  uint64_t delivered() const { return delivered_.load(); }
  uint64_t pending() const { return pending_.load(); }

 private:
  EventBus(const Config& cfg, std::unique_ptr<EventOutbox> outbox);
  void Run();
  // Sends the outbox's oldest rows over a connection to Redis; false when the bus failed.
  bool DeliverPending();

  Config cfg_;
  std::unique_ptr<EventOutbox> outbox_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;
  std::optional<std::chrono::steady_clock::time_point> stop_deadline_;
  std::atomic<uint64_t> delivered_{0}, pending_{0};
  struct Conn;
  std::unique_ptr<Conn> conn_;
  std::thread thread_;
};

}  // namespace sluice
