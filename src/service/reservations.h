// Bytes promised to upload sessions that have not been written yet, per quota scope. A quota
// check counts what the scope holds on disk plus what other sessions may still write, so
// concurrent uploads cannot together overshoot a limit that each alone would fit. Kept in this
// process's memory: sessions found after a restart are reserved again on their next PATCH.
// A tus session can be finished or swept through another node sharing the volume: its
// reservation here says how to find out (SetAlive), and goes once it is found finished (Prune).
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace sluice {

class QuotaReservations {
 public:
  static std::string ScopeKey(const std::string& volume, const std::string& scope_hex) {
    return volume + "/" + scope_hex;
  }
  // A writer's key in its vfolder (a tus session, a clone): what ReleaseVFolder finds.
  static std::string SessionKey(const std::string& volume, const std::string& scope_hex,
                                const std::string& vf_hex, const std::string& session) {
    return volume + "/" + scope_hex + "/" + vf_hex + "/" + session;
  }

  // How many bytes have left the scope's reservations so far (written, so counted in its usage
  // from then on, or given up): read before the scope's usage is, and passed to Reserve.
  uint64_t Moved(const std::string& scope) const {
    std::lock_guard lk(mu_);
    auto it = moved_.find(scope);
    return it == moved_.end() ? 0 : it->second;
  }
  // `scope` names the quota scope (volume + scope id), `session` the upload (vfolder + id).
  // Under the lock, `check(others)` receives what every other session of the scope has
  // reserved and returns whether `bytes` more fit; when it says yes, the session's reservation
  // becomes `bytes`. Returns what `check` returned. `moved_before`: Moved(scope) as read before
  // the usage figure the check compares with; what moved since is in `others` too, since
  // that figure may predate it (else bytes written meanwhile would count nowhere).
  template <typename Check>
  auto Reserve(const std::string& scope, const std::string& session, uint64_t bytes,
               uint64_t moved_before, Check&& check) {
    std::lock_guard lk(mu_);
    uint64_t others = 0;
    for (const auto& [key, r] : by_session_)
      if (r.scope == scope && key != session) others += r.bytes;
    if (auto m = moved_.find(scope); m != moved_.end() && m->second > moved_before)
      others += m->second - moved_before;
    auto verdict = check(others);
    if (verdict.ok()) {
      auto& r = by_session_[session];
      r.scope = scope;
      r.bytes = bytes;
    }
    return verdict;
  }
  // `alive()` says whether the writer `session` still needs its reservation: false once it
  // is finished elsewhere (a tus session committed or swept through another node). Asked
  // without the lock held, by Prune. No-op for unknown sessions.
  void SetAlive(const std::string& session, std::function<bool()> alive) {
    std::lock_guard lk(mu_);
    if (auto it = by_session_.find(session); it != by_session_.end())
      it->second.alive = std::make_shared<const std::function<bool()>>(std::move(alive));
  }
  // Releases the reservations of `scope` (every scope when empty) whose writer is no longer
  // alive (see SetAlive); how many went.
  size_t Prune(const std::string& scope = {}) {
    std::vector<std::pair<std::string, std::shared_ptr<const std::function<bool()>>>> asked;
    {
      std::lock_guard lk(mu_);
      for (const auto& [key, r] : by_session_)
        if (r.alive && (scope.empty() || r.scope == scope)) asked.emplace_back(key, r.alive);
    }
    size_t n = 0;
    for (const auto& [key, alive] : asked) {
      if ((*alive)()) continue;
      std::lock_guard lk(mu_);
      // Still the reservation asked about (not one made again since).
      if (auto it = by_session_.find(key); it != by_session_.end() && it->second.alive == alive) {
        Drop(it);
        ++n;
      }
    }
    return n;
  }
  // The session still needs this many bytes (it wrote some). No-op for unknown sessions.
  void Shrink(const std::string& session, uint64_t bytes) {
    std::lock_guard lk(mu_);
    auto it = by_session_.find(session);
    if (it != by_session_.end() && bytes < it->second.bytes) {
      moved_[it->second.scope] += it->second.bytes - bytes;
      it->second.bytes = bytes;
    }
  }
  // The session needs `bytes` again (what it wrote was rolled back): its reservation grows back
  // to them, no check made, as they were granted before. No-op for unknown sessions.
  void GrowBack(const std::string& session, uint64_t bytes) {
    std::lock_guard lk(mu_);
    auto it = by_session_.find(session);
    if (it != by_session_.end() && bytes > it->second.bytes) it->second.bytes = bytes;
  }
  bool Has(const std::string& session) const {
    std::lock_guard lk(mu_);
    return by_session_.count(session) != 0;
  }
  void Release(const std::string& session) {
    std::lock_guard lk(mu_);
    if (auto it = by_session_.find(session); it != by_session_.end()) Drop(it);
  }
  // Every reservation of the vfolder `vf_hex` on `volume` (its tus uploads, keyed
  // "volume/scope/vfolder/session", and its S3 writes, "s3/volume/vfolder/session"): the vfolder
  // is gone, and what it promised must stop counting against its scope.
  void ReleaseVFolder(const std::string& volume, const std::string& vf_hex) {
    std::lock_guard lk(mu_);
    const std::string mid = "/" + vf_hex + "/";
    for (auto it = by_session_.begin(); it != by_session_.end();) {
      const std::string& k = it->first;
      bool ours = k.find(mid) != std::string::npos &&
                  (k.rfind(volume + "/", 0) == 0 || k.rfind("s3/" + volume + "/", 0) == 0);
      it = ours ? Drop(it) : std::next(it);
    }
  }
  uint64_t Reserved(const std::string& scope) const {
    std::lock_guard lk(mu_);
    uint64_t n = 0;
    for (const auto& [key, r] : by_session_)
      if (r.scope == scope) n += r.bytes;
    return n;
  }

 private:
  struct Reservation {
    std::string scope;
    uint64_t bytes = 0;
    std::shared_ptr<const std::function<bool()>> alive;  // see SetAlive; null: always
  };
  using Sessions = std::map<std::string, Reservation>;
  Sessions::iterator Drop(Sessions::iterator it) {  // mu_ held
    moved_[it->second.scope] += it->second.bytes;
    return by_session_.erase(it);
  }

  mutable std::mutex mu_;
  Sessions by_session_;
  std::map<std::string, uint64_t> moved_;  // scope -> bytes that left its reservations, ever
};

}  // namespace sluice
