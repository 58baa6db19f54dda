// Maintained usage figures for backends without O(1) counters (vfs). A figure per vfolder is
// measured once by a parallel tree walk, then kept current by the writes that go through Sluice
// (uploads, mkdir, deletes) and reconciled by background walks, which pick up what happened on
// disk behind Sluice's back. A request never waits for a walk except the first one for a
// vfolder after start, and concurrent first requests share that walk.
//
// Writes that land while a reconciling walk runs are added to the walk's result: the walk may
// or may not have seen them, so the figure can run high (never low) by those writes until the
// next walk. High is the safe side for quota checks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "volume/volume.h"

namespace sluice {

class UsageTracker {
 public:
  using ScanFn = std::function<Result<TreeUsage>(const std::string& path)>;
  using Clock = std::chrono::steady_clock;

  // `scan` walks a tree (blocking; runs on the caller's thread or the tracker's reconciler
  // thread). A figure older than `reconcile_after` is re-walked in the background when it is
  // read or written, and by the periodic sweep while the vfolder is in use. A tree whose last
  // walk took at most `walk_budget` (small trees: most vfolders) is walked again on every read
  // instead, so its figure is exact; concurrent reads share the walk. 0 disables that.
  UsageTracker(ScanFn scan, std::chrono::milliseconds reconcile_after,
               std::chrono::microseconds walk_budget = std::chrono::microseconds(0));
  ~UsageTracker();
  UsageTracker(const UsageTracker&) = delete;
  UsageTracker& operator=(const UsageTracker&) = delete;

  // The figure for the tree at `path` with measured_at set to when it was last walked. Walks
  // (sharing a running walk) when no figure is known yet.
  Result<TreeUsage> Get(const std::string& path);
  // A write through Sluice changed the tree by these amounts. Ignored while no figure is known
  // (the first walk will see the write).
  void Add(const std::string& path, int64_t bytes, int64_t entries);
  // A write through Sluice failed part way and changed the tree by an amount not known (a
  // directory copied in part): the figure is walked again in the background, and is treated
  // as old until then.
  void Remeasure(const std::string& path);
  // The tree is new with this known content (an empty vfolder, a clone of a measured one).
  void Set(const std::string& path, TreeUsage u);
  // The tree is gone (deleted, detached): drop its figure; a walk in flight is discarded.
  void Forget(const std::string& path);
  // Walks now and replaces the figure (blocking). For tests and for operators.
  Result<TreeUsage> Reconcile(const std::string& path);

  std::chrono::milliseconds reconcile_after() const { return reconcile_after_; }
  size_t tracked() const;

 private:
  struct Entry {
    bool valid = false;
    TreeUsage figure;
    Clock::time_point measured;                           // steady time of the walk's start (ages)
    std::chrono::system_clock::time_point measured_wall;  // the same, as reported
    bool scanning = false;
    std::shared_future<Result<TreeUsage>> scan;  // set while scanning
    int64_t during_bytes = 0;                    // writes seen while scanning
    int64_t during_entries = 0;
    uint64_t generation = 0;      // new with each entry and Set: a walk started before is stale
    bool touched = false;         // read or written since the last walk (the sweep re-walks those)
    bool remeasure = false;       // Remeasure() while a walk ran: that walk's figure is old
    Clock::duration walk_cost{};  // how long the last walk took
  };

  // Starts a walk on the calling thread (waiting instead for one already running); `lk` holds
  // `mu_` on entry and is released.
  Result<TreeUsage> WalkNow(const std::string& path, std::unique_lock<std::mutex>& lk);
  // Runs a walk on this thread and folds its result in. `mu_` must not be held.
  Result<TreeUsage> RunScan(const std::string& path, std::promise<Result<TreeUsage>> promise,
                            uint64_t generation, Clock::time_point started);
  // Starts a background walk of `path` unless one runs. `mu_` held.
  void QueueLocked(const std::string& path, Entry& e);
  TreeUsage WithTime(const Entry& e) const;
  // The entry for `path`, made with a generation of its own when there is none. `mu_` held.
  Entry& EntryLocked(const std::string& path);
  void ReconcilerLoop();

  ScanFn scan_;
  std::chrono::milliseconds reconcile_after_;
  std::chrono::microseconds walk_budget_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  // Generations are never reused, across entries too: an entry made after Forget must not
  // take the figure of a walk that began before it.
  uint64_t next_generation_ = 0;
  std::deque<std::string> queue_;  // background walks to run
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread reconciler_;
};

}  // namespace sluice
