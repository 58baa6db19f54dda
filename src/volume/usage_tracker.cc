#include "volume/usage_tracker.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace sluice {

namespace {

uint64_t Apply(uint64_t v, int64_t delta) {
  if (delta < 0 && static_cast<uint64_t>(-delta) > v) return 0;
  return static_cast<uint64_t>(static_cast<int64_t>(v) + delta);
}

}  // namespace

UsageTracker::UsageTracker(ScanFn scan, std::chrono::milliseconds reconcile_after,
                           std::chrono::microseconds walk_budget)
    : scan_(std::move(scan)), reconcile_after_(reconcile_after), walk_budget_(walk_budget) {
  reconciler_ = std::thread([this] { ReconcilerLoop(); });
}

UsageTracker::~UsageTracker() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  reconciler_.join();
}

size_t UsageTracker::tracked() const {
  std::lock_guard lk(mu_);
  return entries_.size();
}

UsageTracker::Entry& UsageTracker::EntryLocked(const std::string& path) {
  auto [it, made] = entries_.try_emplace(path);
  if (made) it->second.generation = ++next_generation_;
  return it->second;
}

TreeUsage UsageTracker::WithTime(const Entry& e) const {
  TreeUsage u = e.figure;
  u.measured_at = e.measured_wall;
  return u;
}

Result<TreeUsage> UsageTracker::RunScan(const std::string& path,
                                        std::promise<Result<TreeUsage>> promise,
                                        uint64_t generation, Clock::time_point started) {
  Result<TreeUsage> r = scan_(path);
  Result<TreeUsage> out = r;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(path);
    if (it != entries_.end() && it->second.generation == generation) {
      Entry& e = it->second;
      e.scanning = false;
      e.scan = {};
      if (r.ok()) {
        e.figure.used_bytes = Apply(r->used_bytes, e.during_bytes);
        e.figure.file_count = Apply(r->file_count, e.during_entries);
        // Asked to measure again while this walk ran (it may have missed what changed): the
        // figure stays old, and the next read or write walks again.
        e.measured = e.remeasure ? Clock::time_point{} : started;
        e.remeasure = false;
        e.walk_cost = Clock::now() - started;
        e.measured_wall =
            std::chrono::system_clock::now() -
            std::chrono::duration_cast<std::chrono::system_clock::duration>(Clock::now() - started);
        e.valid = true;
        e.touched = false;
        out = WithTime(e);
      } else if (!e.valid) {
        entries_.erase(it);  // nothing known: the next read walks again
      }
      // A failed reconcile of a known figure keeps the figure (and its age says so).
    }
  }
  promise.set_value(out);
  return out;
}

Result<TreeUsage> UsageTracker::WalkNow(const std::string& path, std::unique_lock<std::mutex>& lk) {
  Entry& e = EntryLocked(path);
  if (e.scanning && e.scan.valid()) {
    auto f = e.scan;
    lk.unlock();
    return f.get();
  }
  std::promise<Result<TreeUsage>> promise;
  e.scanning = true;
  e.scan = promise.get_future().share();
  e.during_bytes = e.during_entries = 0;
  uint64_t gen = e.generation;
  lk.unlock();
  return RunScan(path, std::move(promise), gen, Clock::now());
}

Result<TreeUsage> UsageTracker::Get(const std::string& path) {
  std::unique_lock lk(mu_);
  Entry& e = EntryLocked(path);
  if (e.valid) {
    e.touched = true;
    // Small trees: a walk costs less than keeping track, and is exact.
    if (walk_budget_.count() > 0 && e.walk_cost <= walk_budget_) return WalkNow(path, lk);
    if (Clock::now() - e.measured >= reconcile_after_) QueueLocked(path, e);
    return WithTime(e);
  }
  // The first read walks; concurrent readers wait for this walk.
  return WalkNow(path, lk);
}

void UsageTracker::Add(const std::string& path, int64_t bytes, int64_t entries) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(path);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (e.scanning) {
    // Folded into the walk's result, which may or may not have seen the write. Growth is
    // added (high, the safe side, when it had); what went is not subtracted again: the walk
    // either counted it (high by that) or never reached it (its result already lacks it, and
    // subtracting made the figure low, letting writes past the quota).
    e.during_bytes += std::max<int64_t>(bytes, 0);
    e.during_entries += std::max<int64_t>(entries, 0);
  }
  if (e.valid) {
    e.figure.used_bytes = Apply(e.figure.used_bytes, bytes);
    e.figure.file_count = Apply(e.figure.file_count, entries);
    e.touched = true;
  }
}

void UsageTracker::Remeasure(const std::string& path) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(path);
  if (it == entries_.end() || !it->second.valid) return;
  it->second.measured = {};  // old: a read or write before the walk ends asks for one too
  if (it->second.scanning) it->second.remeasure = true;  // that walk may have begun before
  QueueLocked(path, it->second);
}

void UsageTracker::Set(const std::string& path, TreeUsage u) {
  std::lock_guard lk(mu_);
  Entry& e = EntryLocked(path);
  e.generation = ++next_generation_;
  e.scanning = false;
  e.scan = {};
  e.valid = true;
  e.figure = TreeUsage{u.file_count, u.used_bytes, std::nullopt};
  e.measured = Clock::now();
  e.measured_wall = std::chrono::system_clock::now();
  e.touched = false;
}

void UsageTracker::Forget(const std::string& path) {
  // Readers waiting on a walk in flight still get its result; RunScan finds no entry and keeps
  // nothing.
  std::lock_guard lk(mu_);
  entries_.erase(path);
}

Result<TreeUsage> UsageTracker::Reconcile(const std::string& path) {
  std::unique_lock lk(mu_);
  Entry& e = EntryLocked(path);
  if (e.scanning && e.scan.valid()) {
    auto f = e.scan;
    lk.unlock();
    f.get();  // let it finish, then walk afresh: it may have started before the caller's write
    lk.lock();
  }
  return WalkNow(path, lk);
}

void UsageTracker::QueueLocked(const std::string& path, Entry& e) {
  if (e.scanning) return;
  e.scanning = true;
  e.during_bytes = e.during_entries = 0;
  // The future is made when the walk starts; a reader of a valid figure never waits on it.
  queue_.push_back(path);
  cv_.notify_all();
}

void UsageTracker::ReconcilerLoop() {
  std::unique_lock lk(mu_);
  auto next_sweep = Clock::now() + reconcile_after_;
  while (!stop_) {
    if (queue_.empty()) {
      cv_.wait_until(lk, next_sweep, [&] { return stop_ || !queue_.empty(); });
      if (stop_) break;
      if (queue_.empty() && Clock::now() >= next_sweep) {
        // Periodic: re-walk the stale figures of vfolders in use since their last walk.
        auto now = Clock::now();
        for (auto& [path, e] : entries_)
          if (e.valid && e.touched && now - e.measured >= reconcile_after_) QueueLocked(path, e);
        next_sweep = now + reconcile_after_;
      }
      continue;
    }
    std::string path = std::move(queue_.front());
    queue_.pop_front();
    auto it = entries_.find(path);
    // Forgotten, replaced, or already being walked by Reconcile.
    if (it == entries_.end() || !it->second.scanning || it->second.scan.valid()) continue;
    std::promise<Result<TreeUsage>> promise;
    it->second.scan = promise.get_future().share();
    uint64_t gen = it->second.generation;
    lk.unlock();
    auto r = RunScan(path, std::move(promise), gen, Clock::now());
    if (!r.ok()) spdlog::warn("usage reconcile of '{}': {}", path, r.status().ToString());
    lk.lock();
  }
}

}  // namespace sluice
