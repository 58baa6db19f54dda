#include "daemon/daemon.h"

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/client_api.h"
#include "api/internal_api.h"
#include "api/manager_api.h"
#include "api/s3/s3_api.h"
#include "api/server.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/secrets.h"
#include "service/health.h"
#include "service/janitor.h"
#include "service/s3/objects.h"
#include "service/s3/s3_store.h"
#include "service/storage_service.h"
#include "service/task_store.h"
#include "service/upload.h"
#include "volume/registry.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

bool IsUnder(const fs::path& p, const fs::path& dir) {
  auto rel = p.lexically_normal().lexically_relative(dir.lexically_normal());
  return !rel.empty() && *rel.begin() != "..";
}

Result<uid_t> ResolveUser(const std::string& u, gid_t* primary_gid) {
  if (!u.empty() && std::all_of(u.begin(), u.end(), ::isdigit)) {
    uid_t uid = static_cast<uid_t>(std::stoul(u));
    if (struct passwd* pw = ::getpwuid(uid)) *primary_gid = pw->pw_gid;
    return uid;
  }
  struct passwd* pw = ::getpwnam(u.c_str());
  if (!pw)
    return Status(Code::kInvalidArgument, fmt::format("storage-proxy.user: no user '{}'", u));
  *primary_gid = pw->pw_gid;
  return pw->pw_uid;
}

Result<gid_t> ResolveGroup(const std::string& g) {
  if (!g.empty() && std::all_of(g.begin(), g.end(), ::isdigit))
    return static_cast<gid_t>(std::stoul(g));
  struct group* gr = ::getgrnam(g.c_str());
  if (!gr)
    return Status(Code::kInvalidArgument, fmt::format("storage-proxy.group: no group '{}'", g));
  return gr->gr_gid;
}

// After binding privileged ports, run as the configured user and group.
Status DropPrivileges(const Config& cfg) {
  if (cfg.user.empty() && cfg.group.empty()) return Status::Ok();
  if (::geteuid() != 0) {
    spdlog::warn("storage-proxy.user/group are set but sluiced does not run as root; ignored");
    return Status::Ok();
  }
  gid_t gid = ::getegid();
  uid_t uid = ::geteuid();
  if (!cfg.user.empty()) {
    SLUICE_ASSIGN_OR_RETURN(uid, ResolveUser(cfg.user, &gid));
  }
  if (!cfg.group.empty()) {
    SLUICE_ASSIGN_OR_RETURN(gid, ResolveGroup(cfg.group));
  }
  if (::setgroups(0, nullptr) != 0) return Status::FromErrno(errno, "setgroups");
  if (::setgid(gid) != 0) return Status::FromErrno(errno, fmt::format("setgid({})", gid));
  if (::setuid(uid) != 0) return Status::FromErrno(errno, fmt::format("setuid({})", uid));
  spdlog::info("dropped privileges to uid {} gid {}", uid, gid);
  return Status::Ok();
}

// Connections, open files and walks all take descriptors: use what the hard limit allows.
void RaiseFdLimit() {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) == 0)
      spdlog::info("open-file limit raised from {} to {}", was, rl.rlim_cur);
  }
}

}  // namespace

Status PrepareConfig(Config& cfg) {
  std::error_code ec;
  fs::path state = fs::absolute(cfg.state_dir, ec);
  cfg.state_dir = state.lexically_normal().string();
  while (cfg.state_dir.size() > 1 && cfg.state_dir.back() == '/') cfg.state_dir.pop_back();
  fs::create_directories(cfg.state_dir, ec);
  if (ec)
    return Status(Code::kInvalidArgument,
                  fmt::format("sluice.state-dir '{}': {}", cfg.state_dir, ec.message()));
  bool created = false;
  if (cfg.manager_secret.empty()) {
    std::string p = cfg.state_dir + "/secrets/manager.secret";
    SLUICE_ASSIGN_OR_RETURN(cfg.manager_secret, LoadOrCreateSecret(p, &created));
    spdlog::info("manager API secret {} {}", created ? "generated in" : "read from", p);
  }
  if (cfg.secret.empty()) {
    std::string p = cfg.state_dir + "/secrets/token.secret";
    SLUICE_ASSIGN_OR_RETURN(cfg.secret, LoadOrCreateSecret(p, &created));
    spdlog::info("token secret {} {}", created ? "generated in" : "read from", p);
  }
  if (cfg.s3.enabled && cfg.s3.seal_key.empty()) {
    std::string p = cfg.state_dir + "/secrets/s3-seal.key";
    SLUICE_ASSIGN_OR_RETURN(cfg.s3.seal_key, LoadOrCreateSecret(p, &created));
    spdlog::info("S3 seal key {} {}", created ? "generated in" : "read from", p);
  }
  for (auto& v : cfg.volumes) {
    if (!v.local_path()) continue;  // in memory or in an origin: no directory here
    fs::path p = fs::absolute(v.path, ec).lexically_normal();
    v.path = p.string();
    while (v.path.size() > 1 && v.path.back() == '/') v.path.pop_back();
    if (!fs::exists(p, ec)) {
      // Sluice creates volume directories only inside its own state directory.
      if (!IsUnder(p, cfg.state_dir))
        return Status(Code::kInvalidArgument,
                      fmt::format("volume.{}.path '{}' does not exist", v.name, v.path));
      fs::create_directories(p, ec);
      if (ec)
        return Status(Code::kInvalidArgument,
                      fmt::format("volume.{}.path '{}': {}", v.name, v.path, ec.message()));
    }
  }
  return Status::Ok();
}

Status CheckVolumeConfigs(const Config& cfg) {
  ThreadPool scan_pool("check", 1);
  for (const auto& vc : cfg.volumes) {
    // (Before 2026-12-06 the check opened each cache: beside a running daemon it emptied the
    // cache's tmp/ and, at its exit, compacted the daemon's journal out from under it.)
    auto v = VolumeRegistry::Builtin().CreateServed(vc, VolumeDeps{&scan_pool},
                                                    /*open_cache=*/false);
    if (!v.ok()) return v.status();
  }
  return Status::Ok();
}

int RunDaemon(Config cfg) {
  // Signals are taken synchronously by the main thread: block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  InitLogging(cfg.log_level);
  for (const auto& w : cfg.warnings) spdlog::warn("config: {}", w);
  RaiseFdLimit();

  Status st = PrepareConfig(cfg);
  if (!st.ok()) {
    spdlog::critical("{}", st.message());
    return 2;
  }

  ThreadPool io_pool("io", cfg.io_threads, 100000, {cfg.io_threads_max});
  io_pool.SetGauges(
      &Metrics::Global().Gauge("sluice_io_pool_threads",
                               "Threads of the I/O pool (io-threads, more while all are busy, up "
                               "to io-threads-max).",
                               ""),
      &Metrics::Global().Gauge("sluice_io_pool_busy", "I/O pool threads running a task now.", ""));
  ThreadPool task_pool("task", cfg.task_threads);
  ThreadPool scan_pool("scan", cfg.scan_threads);

  std::vector<std::unique_ptr<Volume>> volumes;
  // A volume whose storage hangs holds at most half the I/O pool's threads (VolumeConfig).
  const int max_operations = std::max(64, static_cast<int>(cfg.io_threads_max / 2));
  for (const auto& vc : cfg.volumes) {
    auto v = VolumeRegistry::Builtin().CreateServed(vc, VolumeDeps{&scan_pool, max_operations});
    if (!v.ok()) {
      spdlog::critical("{}", v.status().message());
      return 2;
    }
    Status init = (*v)->Init();
    if (!init.ok()) {
      spdlog::critical("volume {}: {}", vc.name, init.message());
      return 2;
    }
    spdlog::info("volume {}: backend {} at {} (layout v{})", vc.name, vc.backend, vc.path,
                 (*v)->layout_version());
    volumes.push_back(std::move(v).value());
  }
  StorageService service(cfg, std::move(volumes), &task_pool);
  // Probes answer from this, kept current in the background.
  HealthMonitor health_monitor(&service);
  health_monitor.Start();

  size_t nloops = cfg.num_proc > 0 ? static_cast<size_t>(cfg.num_proc)
                                   : std::max(1u, std::thread::hardware_concurrency());
  api::IoLoops loops(nloops);
  std::vector<std::shared_ptr<api::HttpServer>> servers;
  std::atomic<bool> draining{false};
  api::HealthSource health{&health_monitor, cfg.node_id, [&draining] { return draining.load(); }};

  // S3: users, keys and bucket names on shared storage, reloaded as other nodes change them.
  std::unique_ptr<S3Store> s3_store;
  if (cfg.s3.enabled) {
    std::string path = cfg.s3.state_path;
    if (path.empty()) {
      for (const auto& v : cfg.volumes)
        if (v.local_path()) {
          path = v.path + "/.sluice/s3";
          break;
        }
      if (path.empty()) path = cfg.state_dir + "/s3";
    }
    auto store = S3Store::Open(path, cfg.s3.seal_key);
    if (!store.ok()) {
      spdlog::critical("api.s3.state-path: {}", store.status().message());
      return 2;
    }
    s3_store = std::move(store).value();
    s3_store->Start(cfg.s3.refresh);
    spdlog::info("S3 users, keys and buckets in {}", path);
  }
  // Empties the volumes' trash and removes upload sessions abandoned for longer than
  // session-expire (and S3 multipart uploads past multipart-expiry): now, then periodically.
  // Declared after what its chores use, so it stops first.
  Janitor janitor(&service);
  if (s3_store) {
    // Every node sweeps the buckets it serves (two removing the same upload is harmless).
    janitor.AddChore("S3 multipart sweep",
                     [&service, store = s3_store.get(), age = cfg.s3.multipart_expiry] {
                       ObjectStore objects(&service.reservations());
                       for (const auto& b : store->Buckets()) {
                         auto v = service.GetVolume(b.volume);
                         auto id = VFolderId::Parse(b.vfid);
                         // One bucket's failure does not keep the others unswept.
                         try {
                           if (v.ok() && id.ok()) objects.SweepMultipart(**v, *id, age);
                         } catch (const std::exception& e) {
                           spdlog::warn("s3: multipart sweep of bucket {}: {}", b.name, e.what());
                         }
                       }
                     });
  }
  janitor.Start();

  auto make_server = [&](const std::string& name, const ListenerConfig& lc,
                         std::shared_ptr<api::Router> router) -> Status {
    api::ServerOptions o;
    o.name = name;
    o.addr = lc.addr;
    o.body_limit = cfg.max_request_body;
    o.body_budget = cfg.max_buffered_request_bodies;
    o.max_connections = cfg.max_connections;
    o.request_timeout = cfg.request_timeout;
    o.keepalive_timeout = cfg.keepalive_timeout;
    if (lc.ssl_enabled) {
      SLUICE_ASSIGN_OR_RETURN(o.tls, api::MakeTlsContext(lc.ssl_cert, lc.ssl_privkey));
    }
    auto srv = std::make_shared<api::HttpServer>(loops, std::move(o), std::move(router));
    SLUICE_RETURN_IF_ERROR(srv->Listen());
    servers.push_back(std::move(srv));
    return Status::Ok();
  };
  st = make_server(
      "manager", cfg.manager,
      api::MakeManagerRouter(&service, &io_pool, cfg.manager_secret, health, s3_store.get()));
  if (st.ok())
    st = make_server("client", cfg.client, api::MakeClientRouter(&service, &io_pool, health));
  if (st.ok())
    st = make_server("internal", ListenerConfig{cfg.internal, false, "", ""},
                     api::MakeInternalRouter(&io_pool, health));
  if (st.ok() && s3_store) {
    api::S3Options so;
    so.region = cfg.s3.region;
    so.durable = cfg.s3.durable;
    so.domain = cfg.s3.domain;
    so.max_multipart_uploads = cfg.s3.max_multipart_uploads;
    so.max_buckets = cfg.s3.max_buckets;
    so.keepalive = cfg.s3.keepalive;
    st = make_server("s3", cfg.s3.listener,
                     api::MakeS3Router(&service, s3_store.get(), &io_pool, so));
  }
  if (!st.ok()) {
    spdlog::critical("{}", st.message());
    return st.code() == Code::kInvalidArgument ? 2 : 1;
  }

  // Where each listener is bound (the kernel chooses ports configured as 0): tools and test
  // harnesses read this instead of guessing free ports. Written while still privileged, like
  // the pid file.
  {
    nlohmann::json bound = nlohmann::json::object();
    for (auto& s : servers) bound[s->options().name] = s->url();
    Status wrote = WriteFileAtomic(cfg.state_dir + "/listeners.json", bound.dump(2) + "\n", 0644);
    if (!wrote.ok()) spdlog::warn("cannot record the bound addresses: {}", wrote.message());
  }
  // The pid file is written while still privileged: its directory (/run) usually belongs to root.
  if (!cfg.pid_file.empty()) {
    std::ofstream pf(cfg.pid_file);
    pf << ::getpid() << "\n";
    if (!pf) spdlog::warn("cannot write pid file '{}'", cfg.pid_file);
  }
  st = DropPrivileges(cfg);
  if (!st.ok()) {
    spdlog::critical("{}", st.message());
    return 1;
  }
  // Opened as the user that runs the daemon, before any task can start. The history is
  // worth less than serving: without it the daemon runs, and says so.
  {
    std::string path = cfg.state_dir + "/tasks.db";
    auto store = TaskStore::Open(path);
    Status kept = store.ok() ? service.tasks().Persist(std::move(store).value()) : store.status();
    if (!kept.ok())
      spdlog::error("background-task history is kept in memory only, not across restarts: {}",
                    kept.message());
  }

  // Clone and delete completions go to Backend.AI's event bus through a durable outbox.
  std::unique_ptr<EventBus> events;
  if (cfg.events.enabled && (cfg.events.redis_addr || cfg.etcd.addr)) {
    auto bus = EventBus::Open(cfg);
    if (!bus.ok()) {
      spdlog::critical("event bus: {}", bus.status().message());
      return 1;
    }
    events = std::move(bus).value();
    service.SetEventBus(events.get());
    events->Start();
  } else {
    spdlog::warn(
        "no event bus ([etcd] addr or [events] redis-addr): a Backend.AI manager will not "
        "learn that vfolder clones and deletes finished");
  }
  // Deletes and clones the last stop cut short are finished or undone, and announced.
  service.ResumeInterrupted(service.tasks().TakeInterrupted());

  loops.Start();
  for (auto& s : servers) s->Start();
  spdlog::info("sluiced {} ({} event loops) node {}", api::SluiceVersion(), loops.size(),
               cfg.node_id);
  for (auto& s : servers) spdlog::info("{} API listening on {}", s->options().name, s->url());
  if (cfg.embedded_default)
    spdlog::info("embedded default: state in {}; manager token in {}/secrets/manager.secret",
                 cfg.state_dir, cfg.state_dir);

  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("received {}; draining (up to {}s)", strsignal(sig), cfg.drain_timeout.count());
  draining = true;
  for (auto& s : servers) s->Stop();
  auto deadline = std::chrono::steady_clock::now() + cfg.drain_timeout;
  auto busy = [&] {
    for (auto& s : servers)
      if (s->inflight() > 0) return true;
    return false;
  };
  while (busy() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (busy()) spdlog::warn("drain timeout: closing connections with requests in flight");
  auto left = deadline - std::chrono::steady_clock::now();
  if (!service.tasks().WaitIdle(left > left.zero() ? left : left.zero()))
    spdlog::warn(
        "background tasks still running at exit: vfolder deletes and clones are finished or "
        "undone at the next start (others are failed 'interrupted')");
  if (events) {
    auto rest = deadline - std::chrono::steady_clock::now();
    events->Stop(std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(rest),
                            std::chrono::milliseconds(500), std::chrono::milliseconds(5000)));
  }
  loops.Stop();
  io_pool.Shutdown();
  // What volumes keep for the next start (the SSD caches' record of checked blocks).
  for (Volume* v : service.Volumes()) v->Shutdown();
  if (!cfg.pid_file.empty()) ::unlink(cfg.pid_file.c_str());
  spdlog::info("sluiced stopped");
  spdlog::shutdown();
  // Background tasks that outlived the drain must not run during static destruction.
  std::_Exit(0);
}

}  // namespace sluice
