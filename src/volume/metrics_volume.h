// Per-volume accounting as a decorator: operations (count, failures, time spent) and bytes read
// and written, for /metrics and /volume/performance-metric. The daemon wraps every volume in
// one, so no API or service counts I/O itself; a read through any protocol, zero-copy sends
// included (FileReader::CountSent), and every staged write are counted here.
//
// It is also the volume's bulkhead: at most `max_operations` of its operations that may block
// on storage (the volume's calls, and its readers', directories' and writers' blocking calls)
// run at once. Storage that stops answering (a hung mount, an origin that says nothing) thus
// holds at most that many of the node's threads; later operations fail at once (kUnavailable,
// errno EBUSY: HTTP 503) instead of taking more threads from every other volume.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>

#include "volume/forwarding_volume.h"

namespace sluice {

class MetricsVolume : public ForwardingVolume {
 public:
  enum class Op {
    kOpen,
    kStat,
    kList,
    kMkdir,
    kRename,
    kMove,
    kDelete,
    kStage,    // staging: create, open, commit
    kVFolder,  // create, detach, clone
    kUsage,
    kCount,
  };
  static const char* OpName(Op op);

  // max_operations: 0 for no limit.
  explicit MetricsVolume(std::unique_ptr<Volume> inner, int max_operations = 0);

  VolumeIoStats& io_stats() override { return *stats_; }

  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override;
  Result<std::string> DetachVFolder(const VFolderId& vfid) override;
  Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                         const TreeUsage& size) override;
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;
  Result<TreeUsage> GetFreshUsage(const VFolderId& vfid) override;
  Status Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
               bool exist_ok) override;
  Status Rename(const VFolderId& vfid, std::string_view relpath,
                std::string_view new_name) override;
  Status Move(const VFolderId& vfid, std::string_view src, std::string_view dst) override;
  Status DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                     bool recursive) override;
  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid, std::string_view relpath,
                                                 Lookup lookup = Lookup::kMayBlock,
                                                 const LookupHint* hint = nullptr) override;
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                             std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid, std::string_view relpath,
                                                 const ListFrom& from) override;
  Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                           std::string_view start_after, size_t max) override;
  Result<std::string> CreateStaging(const VFolderId& vfid) override;
  Result<std::unique_ptr<StagingWriter>> OpenStaging(
      const VFolderId& vfid, const std::string& session,
      std::chrono::milliseconds wait = std::chrono::milliseconds(0)) override;

  // Counts one operation of kind `op` that started at `t0` and ended with `st`.
  void Count(Op op, std::chrono::steady_clock::time_point t0, const Status& st);

  // The bulkhead. Enter() counts one more operation; one that `may_refuse` is refused instead
  // (false) while max_operations run. Leave() ends it; Busy() is what a refused one answers.
  bool Enter(bool may_refuse);
  void Leave();
  Status Busy() const;
  int running() const { return running_.load(std::memory_order_relaxed); }

  // One operation in the bulkhead's count while it lives. `may_refuse`: an operation that
  // starts something (an open, a listing, a change) is refused at the limit; one that goes on
  // with what was admitted (a stream's reads and writes, a directory's entries, a commit) or
  // cleans up is counted but never refused, so that a download or an upload is never cut
  // short halfway by the limit.
  class Operation {
   public:
    Operation(MetricsVolume* v, bool may_refuse) : v_(v), in_(v->Enter(may_refuse)) {}
    ~Operation() {
      if (in_) v_->Leave();
    }
    Operation(const Operation&) = delete;
    Operation& operator=(const Operation&) = delete;
    explicit operator bool() const { return in_; }

   private:
    MetricsVolume* v_;
    bool in_;
  };

  Status CheckVFolder(const VFolderId& vfid) override;
  Result<uint64_t> GetUsedBytes(const VFolderId& vfid) override;
  Result<FsUsage> GetFsUsage() override;
  Result<StagingState> InspectStaging(const VFolderId& vfid, const std::string& session) override;
  Status DiscardStaging(const VFolderId& vfid, const std::string& session) override;
  StagingSweep SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                            const StagingRemoved& removed) override;

 private:
  struct OpCounters {
    std::atomic<uint64_t>* ok;
    std::atomic<uint64_t>* failed;
    std::atomic<uint64_t>* usec;
  };
  // Runs `fn` (one call of the volume below) as an operation of kind `op`: admitted by the
  // bulkhead, timed and counted.
  template <typename F>
  auto Run(Op op, F&& fn, bool may_refuse = true) -> decltype(fn()) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = Admitted(fn, may_refuse);
    if constexpr (std::is_same_v<decltype(r), Status>)
      Count(op, t0, r);
    else
      Count(op, t0, r.status());
    return r;
  }
  // Runs `fn` admitted by the bulkhead (not counted as an operation of a kind), or Busy().
  template <typename F>
  auto Admitted(F&& fn, bool may_refuse = true) -> decltype(fn()) {
    Operation admitted(this, may_refuse);
    if (!admitted) return Busy();
    return fn();
  }

  VolumeIoStats* stats_;
  const int max_operations_;
  std::atomic<int> running_{0};
  std::atomic<int64_t>* g_running_;
  std::atomic<uint64_t>* g_refused_;
  std::array<OpCounters, static_cast<size_t>(Op::kCount)> ops_;
};

}  // namespace sluice
