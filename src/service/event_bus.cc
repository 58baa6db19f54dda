#include "service/event_bus.h"

#include <hiredis/hiredis.h>
#include <sqlite3.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <openssl/evp.h>

#include "common/http_client.h"
#include "common/json.h"

namespace sluice {

namespace {

constexpr std::chrono::seconds kNetTimeout{5};
// Backend.AI's producers trim the stream to about this many entries (XADD MAXLEN ~ 128).
constexpr const char* kStreamMaxLen = "128";
constexpr size_t kBatch = 64;

BusEvent Make(std::string name, std::vector<std::pair<const char*, std::string>> fields) {
  BusEvent e;
  e.name = std::move(name);
  for (auto& [k, v] : fields) {
    // A message can quote a file's name, which need not be UTF-8: JSON (the outbox) would
    // refuse it, and the manager's msgpack decoder too.
    std::string text = IsAscii(v) ? std::move(v) : SanitizeUtf8(v);
    e.payload[k] = text;
    e.args.push_back(std::move(text));
  }
  return e;
}

}  // namespace

BusEvent VFolderDeletionSuccess(const std::string& vfid) {
  return Make("vfolder_deletion_success", {{"vfid", vfid}});
}
BusEvent VFolderDeletionFailure(const std::string& vfid, const std::string& message) {
  return Make("vfolder_deletion_failure", {{"vfid", vfid}, {"message", message}});
}
BusEvent VFolderCloneSuccess(const std::string& src_vfid, const std::string& dst_vfid) {
  return Make("vfolder_clone_success", {{"vfid", src_vfid}, {"dst_vfid", dst_vfid}});
}
BusEvent VFolderCloneFailure(const std::string& src_vfid, const std::string& dst_vfid,
                             const std::string& message) {
  return Make("vfolder_clone_failure",
              {{"vfid", src_vfid}, {"dst_vfid", dst_vfid}, {"message", message}});
}

// ------------------------------------------------------------------------------------ etcd

namespace {

Result<HostPort> ParseHostPort(std::string_view s, std::string_view what) {
  size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size())
    return Status(Code::kInvalidArgument, fmt::format("{} '{}' is not host:port", what, s));
  HostPort hp;
  hp.host = std::string(s.substr(0, colon));
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']')
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  int port = 0;
  for (char c : s.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535)
      return Status(Code::kInvalidArgument, fmt::format("{} '{}' has a bad port", what, s));
    port = port * 10 + (c - '0');
  }
  if (port == 0 || port > 65535)
    return Status(Code::kInvalidArgument, fmt::format("{} '{}' has a bad port", what, s));
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

// etcd's JSON gateway carries keys and values in standard base64.
std::string Base64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3), '\0');
  int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::optional<std::string> Unbase64(std::string_view s) {
  if (s.size() % 4) return std::nullopt;
  std::string out(3 * (s.size() / 4), '\0');
  int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return std::nullopt;
  size_t len = static_cast<size_t>(n);
  // EVP_DecodeBlock counts the padding as data.
  for (size_t i = s.size(); i > 0 && s[i - 1] == '='; --i) --len;
  out.resize(len);
  return out;
}

// Backend.AI quotes each key component (urllib quote, safe="").
std::string Unquote(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      auto hex = [](char c) {
        return c >= '0' && c <= '9'   ? c - '0'
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                      : -1;
      };
      int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// Every key under `prefix` (which ends with '/'), by the rest of its name, through etcd v3's
// JSON gateway (the same server Backend.AI's gRPC client talks to).
Result<std::map<std::string, std::string>> EtcdPrefix(net::Client& client,
                                                      const std::string& prefix) {
  std::string end = prefix;
  end.back() = static_cast<char>(end.back() + 1);
  nlohmann::json req = {{"key", Base64(prefix)}, {"range_end", Base64(end)}};
  SLUICE_ASSIGN_OR_RETURN(net::HttpAnswer a,
                          client.Request(boost::beast::http::verb::post, "/v3/kv/range", req));
  if (!a.ok())
    return Status(Code::kUnavailable,
                  fmt::format("etcd answered {} to a range read: {}", a.status, a.body));
  std::map<std::string, std::string> out;
  auto j = nlohmann::json::parse(a.body, nullptr, false);
  auto text = [](const nlohmann::json& kv, const char* field) -> std::optional<std::string> {
    auto it = kv.find(field);
    if (it == kv.end() || !it->is_string()) return std::nullopt;
    return Unbase64(it->get_ref<const std::string&>());
  };
  // Not etcd's shape (another server at that address): said so, never a thrown type error.
  auto kvs = j.is_object() ? j.find("kvs") : j.end();
  if (j.is_discarded() || !j.is_object() || (kvs != j.end() && !kvs->is_array()))
    return Status(Code::kUnavailable, "etcd's answer to a range read is not an etcd range answer");
  if (kvs == j.end()) return out;  // no key under the prefix
  for (const auto& kv : *kvs) {
    if (!kv.is_object()) continue;
    auto key = text(kv, "key");
    auto val = kv.contains("value") ? text(kv, "value") : std::string();  // absent when empty
    if (!key || !val || key->size() <= prefix.size()) continue;
    // The rest of the key, each component unquoted, '/' kept as the separator.
    std::string_view r = std::string_view(*key).substr(prefix.size());
    std::string rest;
    for (size_t i = 0;;) {
      size_t slash = std::min(r.find('/', i), r.size());
      if (i) rest += '/';
      rest += Unquote(r.substr(i, slash - i));
      if (slash == r.size()) break;
      i = slash + 1;
    }
    out[rest] = *val;
  }
  return out;
}

// A Redis configuration (`addr`, `password`, `sentinel`, `service_name`) found under one key
// set; `prefix` selects a sub-tree ("" or "override_configs/stream/").
std::optional<std::map<std::string, std::string>> Pick(const std::map<std::string, std::string>& kv,
                                                       const std::string& prefix) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : kv) {
    if (k.rfind(prefix, 0) != 0) continue;
    std::string rest = k.substr(prefix.size());
    for (auto& c : rest)
      if (c == '-') c = '_';  // aliases: service-name, redis-helper-config
    out[rest] = v;
  }
  if (!out.count("addr") && !out.count("sentinel")) return std::nullopt;
  return out;
}

struct RedisReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, RedisReplyDeleter>;
struct RedisCtxDeleter {
  void operator()(redisContext* c) const {
    if (c) redisFree(c);
  }
};
using RedisCtx = std::unique_ptr<redisContext, RedisCtxDeleter>;

Result<RedisCtx> RedisConnect(const HostPort& addr) {
  timeval tv{static_cast<time_t>(kNetTimeout.count()), 0};
  RedisCtx c(redisConnectWithTimeout(addr.host.c_str(), addr.port, tv));
  if (!c) return Status(Code::kUnavailable, "cannot allocate a Redis connection");
  if (c->err)
    return Status(Code::kUnavailable,
                  fmt::format("connect to Redis at {}: {}", addr.ToString(), c->errstr));
  redisSetTimeout(c.get(), tv);
  return c;
}

Result<Reply> Command(redisContext* c, const std::vector<std::string>& argv) {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (const auto& a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  Reply r(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), ptrs.data(), lens.data())));
  if (!r)
    return Status(Code::kUnavailable, fmt::format("Redis {}: {}", argv.empty() ? "" : argv[0],
                                                  c->err ? c->errstr : "no reply"));
  if (r->type == REDIS_REPLY_ERROR)
    return Status(Code::kUnavailable,
                  fmt::format("Redis {}: {}", argv[0], std::string(r->str, r->len)));
  return r;
}

// Asks each sentinel in turn where the master of `service` is.
Result<HostPort> AskSentinels(const std::string& list, const std::string& service) {
  Status last(Code::kUnavailable, "no sentinel address given");
  size_t i = 0;
  while (i <= list.size()) {
    size_t j = list.find(',', i);
    if (j == std::string::npos) j = list.size();
    std::string one = list.substr(i, j - i);
    i = j + 1;
    one.erase(0, one.find_first_not_of(' '));
    if (one.empty()) continue;
    auto hp = ParseHostPort(one, "redis sentinel");
    if (!hp.ok()) return hp.status();
    auto c = RedisConnect(*hp);
    if (!c.ok()) {
      last = c.status();
      continue;
    }
    auto r = Command(c->get(), {"SENTINEL", "get-master-addr-by-name", service});
    auto str = [](const redisReply* e) {
      return e->type == REDIS_REPLY_STRING ? std::optional<std::string>(std::string(e->str, e->len))
                                           : std::nullopt;
    };
    if (r.ok() && (*r)->type == REDIS_REPLY_ARRAY && (*r)->elements == 2) {
      auto host = str((*r)->element[0]), port = str((*r)->element[1]);
      if (host && port) return ParseHostPort(fmt::format("{}:{}", *host, *port), "redis master");
    }
    last = r.ok() ? Status(Code::kUnavailable,
                           fmt::format("sentinel {} does not know master '{}'", one, service))
                  : r.status();
  }
  return last;
}

}  // namespace

Result<RedisTarget> LocateRedis(const Config& cfg) {
  if (cfg.events.redis_addr) return RedisTarget{*cfg.events.redis_addr, cfg.events.redis_password};
  if (!cfg.etcd.addr)
    return Status(Code::kUnavailable,
                  "no event bus configured: set [events] redis-addr or [etcd] addr");
  net::ClientOptions o;
  o.endpoint.host = cfg.etcd.addr->host;
  o.endpoint.port = std::to_string(cfg.etcd.addr->port);
  o.timeout = kNetTimeout;
  net::Client client(o);
  if (!cfg.etcd.user.empty() && !cfg.etcd.password.empty()) {
    SLUICE_ASSIGN_OR_RETURN(
        net::HttpAnswer a,
        client.Request(boost::beast::http::verb::post, "/v3/auth/authenticate",
                       {{"name", cfg.etcd.user}, {"password", cfg.etcd.password}}));
    auto j = nlohmann::json::parse(a.body, nullptr, false);
    if (!a.ok() || !j.is_object() || !j.contains("token") || !j["token"].is_string())
      return Status(Code::kUnavailable,
                    fmt::format("etcd refused user '{}': {} {}", cfg.etcd.user, a.status, a.body));
    o.headers.emplace_back("Authorization", j["token"].get<std::string>());
  }
  net::Client authed(o);
  const std::string base = fmt::format("/sorna/{}/", cfg.etcd.ns);
  SLUICE_ASSIGN_OR_RETURN(
      auto node,
      EtcdPrefix(authed, fmt::format("{}nodes/storage/{}/config/redis/", base, cfg.node_id)));
  SLUICE_ASSIGN_OR_RETURN(auto global, EtcdPrefix(authed, base + "config/redis/"));
  // The node's scope wins over the global one, key by key (Backend.AI's ChainMap).
  for (auto& [k, v] : global) node.emplace(k, v);
  auto conf = Pick(node, "override_configs/stream/");
  if (!conf) conf = Pick(node, "");
  if (!conf)
    return Status(Code::kUnavailable,
                  fmt::format("etcd at {} has no Redis address under {}config/redis/",
                              cfg.etcd.addr->ToString(), base));
  RedisTarget t;
  t.password = (*conf)["password"];
  if (auto s = conf->find("sentinel"); s != conf->end() && !s->second.empty()) {
    std::string service = (*conf)["service_name"];
    if (service.empty()) service = "manager";
    SLUICE_ASSIGN_OR_RETURN(t.addr, AskSentinels(s->second, service));
  } else {
    SLUICE_ASSIGN_OR_RETURN(t.addr, ParseHostPort((*conf)["addr"], "redis addr"));
  }
  return t;
}

// ---------------------------------------------------------------------------------- outbox

Result<std::unique_ptr<EventOutbox>> EventOutbox::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return Status(Code::kIoError, fmt::format("open event outbox '{}': {}", path, msg));
  }
  std::unique_ptr<EventOutbox> o(new EventOutbox(db));
  sqlite3_busy_timeout(db, 5000);
  SLUICE_RETURN_IF_ERROR(o->Exec("PRAGMA journal_mode=WAL"));
  SLUICE_RETURN_IF_ERROR(o->Exec("PRAGMA synchronous=FULL"));
  SLUICE_RETURN_IF_ERROR(
      o->Exec("CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, "
              "name TEXT NOT NULL, body TEXT NOT NULL, created REAL NOT NULL)"));
  return o;
}

EventOutbox::~EventOutbox() {
  sqlite3_close(db_);
}

Status EventOutbox::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    Status s(Code::kIoError, fmt::format("event outbox: {}: {}", sql, err ? err : "?"));
    sqlite3_free(err);
    return s;
  }
  return Status::Ok();
}

namespace {
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};
}  // namespace

Status EventOutbox::Append(const BusEvent& e) {
  std::lock_guard lk(mu_);
  Stmt q;
  if (sqlite3_prepare_v2(db_, "INSERT INTO outbox (name, body, created) VALUES (?, ?, ?)", -1, &q.s,
                         nullptr) != SQLITE_OK)
    return Status(Code::kIoError, fmt::format("event outbox: {}", sqlite3_errmsg(db_)));
  std::string body = nlohmann::json{{"payload", e.payload}, {"args", e.args}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  sqlite3_bind_text(q.s, 1, e.name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q.s, 2, body.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(q.s, 3, now);
  if (sqlite3_step(q.s) != SQLITE_DONE)
    return Status(Code::kIoError, fmt::format("event outbox append: {}", sqlite3_errmsg(db_)));
  return Status::Ok();
}

Result<std::vector<EventOutbox::Row>> EventOutbox::Oldest(size_t n) {
  std::lock_guard lk(mu_);
  Stmt q;
  if (sqlite3_prepare_v2(db_, "SELECT id, name, body FROM outbox ORDER BY id LIMIT ?", -1, &q.s,
                         nullptr) != SQLITE_OK)
    return Status(Code::kIoError, fmt::format("event outbox: {}", sqlite3_errmsg(db_)));
  sqlite3_bind_int64(q.s, 1, static_cast<int64_t>(n));
  std::vector<Row> rows;
  int rc;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
    Row r;
    r.id = sqlite3_column_int64(q.s, 0);
    r.event.name = reinterpret_cast<const char*>(sqlite3_column_text(q.s, 1));
    auto body = nlohmann::json::parse(reinterpret_cast<const char*>(sqlite3_column_text(q.s, 2)),
                                      nullptr, false);
    if (body.is_object()) {
      r.event.payload = body.value("payload", nlohmann::json::object());
      for (const auto& a : body.value("args", nlohmann::json::array()))
        if (a.is_string()) r.event.args.push_back(a.get<std::string>());
    }
    rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE)
    return Status(Code::kIoError, fmt::format("event outbox read: {}", sqlite3_errmsg(db_)));
  return rows;
}

Status EventOutbox::Remove(int64_t id) {
  std::lock_guard lk(mu_);
  Stmt q;
  if (sqlite3_prepare_v2(db_, "DELETE FROM outbox WHERE id = ?", -1, &q.s, nullptr) != SQLITE_OK)
    return Status(Code::kIoError, fmt::format("event outbox: {}", sqlite3_errmsg(db_)));
  sqlite3_bind_int64(q.s, 1, id);
  if (sqlite3_step(q.s) != SQLITE_DONE)
    return Status(Code::kIoError, fmt::format("event outbox remove: {}", sqlite3_errmsg(db_)));
  return Status::Ok();
}

Result<uint64_t> EventOutbox::Count() {
  std::lock_guard lk(mu_);
  Stmt q;
  if (sqlite3_prepare_v2(db_, "SELECT COUNT(*) FROM outbox", -1, &q.s, nullptr) != SQLITE_OK ||
      sqlite3_step(q.s) != SQLITE_ROW)
    return Status(Code::kIoError, fmt::format("event outbox: {}", sqlite3_errmsg(db_)));
  return static_cast<uint64_t>(sqlite3_column_int64(q.s, 0));
}

// ------------------------------------------------------------------------------------- bus

struct EventBus::Conn {
  RedisCtx ctx;
};

Result<std::unique_ptr<EventBus>> EventBus::Open(const Config& cfg) {
  SLUICE_ASSIGN_OR_RETURN(auto outbox, EventOutbox::Open(cfg.state_dir + "/events.db"));
  return std::unique_ptr<EventBus>(new EventBus(cfg, std::move(outbox)));
}

EventBus::EventBus(const Config& cfg, std::unique_ptr<EventOutbox> outbox)
    : cfg_(cfg), outbox_(std::move(outbox)) {
  if (auto n = outbox_->Count(); n.ok()) pending_ = *n;
}

EventBus::~EventBus() {
  Stop(std::chrono::milliseconds(0));
}

void EventBus::Start() {
  if (pending_)
    spdlog::info("event bus: {} events from before the restart wait for delivery", pending_.load());
  thread_ = std::thread([this] { Run(); });
}

Status EventBus::Publish(const BusEvent& e) {
  SLUICE_RETURN_IF_ERROR(outbox_->Append(e));
  ++pending_;
  {
    std::lock_guard lk(mu_);
    wake_ = true;
  }
  cv_.notify_all();
  return Status::Ok();
}

void EventBus::Stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard lk(mu_);
    if (!thread_.joinable()) return;
    stop_deadline_ = std::chrono::steady_clock::now() + grace;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (pending_)
    spdlog::warn("event bus: {} events not delivered yet; they are kept for the next start",
                 pending_.load());
}

bool EventBus::DeliverPending() {
  auto fail = [this](const Status& s) {
    conn_.reset();
    spdlog::warn("event bus: {} ({} events waiting)", s.message(), pending_.load());
    return false;
  };
  for (;;) {
    auto rows = outbox_->Oldest(kBatch);
    if (!rows.ok()) return fail(rows.status());
    if (rows->empty()) return true;
    if (!conn_) {
      auto target = LocateRedis(cfg_);
      if (!target.ok()) return fail(target.status());
      auto ctx = RedisConnect(target->addr);
      if (!ctx.ok()) return fail(ctx.status());
      if (!target->password.empty()) {
        auto r = Command(ctx->get(), {"AUTH", target->password});
        if (!r.ok()) return fail(r.status());
      }
      auto r = Command(ctx->get(), {"SELECT", std::to_string(cfg_.events.redis_db)});
      if (!r.ok()) return fail(r.status());
      conn_ = std::make_unique<Conn>();
      conn_->ctx = std::move(ctx).value();
      spdlog::info("event bus: connected to Redis at {} (db {}, stream '{}')",
                   target->addr.ToString(), cfg_.events.redis_db, cfg_.events.stream);
    }
    for (const auto& row : *rows) {
      std::vector<uint8_t> args = nlohmann::json::to_msgpack(nlohmann::json(row.event.args));
      auto r = Command(conn_->ctx.get(),
                       {"XADD", cfg_.events.stream, "MAXLEN", "~", kStreamMaxLen, "*", "name",
                        row.event.name, "source", cfg_.events.source, "payload",
                        row.event.payload.dump(), "args", std::string(args.begin(), args.end())});
      if (!r.ok()) return fail(r.status());
      Status s = outbox_->Remove(row.id);
      if (!s.ok()) return fail(s);  // sent again later: at least once
      --pending_;
      ++delivered_;
      spdlog::info("event bus: sent {} {}", row.event.name, row.event.payload.dump());
    }
  }
}

void EventBus::Run() {
  auto backoff = std::chrono::milliseconds(250);
  const auto max_backoff =
      std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.events.retry_max);
  for (;;) {
    bool ok = DeliverPending();
    std::unique_lock lk(mu_);
    if (stop_ && (ok || std::chrono::steady_clock::now() >= *stop_deadline_)) break;
    if (ok) {
      backoff = std::chrono::milliseconds(250);
      cv_.wait(lk, [this] { return wake_ || stop_; });
    } else {
      auto until = std::chrono::steady_clock::now() + backoff;
      if (stop_) until = std::min(until, *stop_deadline_);
      cv_.wait_until(lk, until, [this] { return stop_ && wake_; });
      backoff = std::min(backoff * 2, max_backoff);
    }
    wake_ = false;
  }
  conn_.reset();
}

}  // namespace sluice
