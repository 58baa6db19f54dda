#include "volume/metrics_volume.h"

#include <optional>

#include <fmt/format.h>

namespace sluice {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t MicrosSince(Clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
}

// Reads (positional, and zero-copy sends) counted into the volume's statistics.
class MeteredReader : public ForwardingFileReader {
 public:
  MeteredReader(std::shared_ptr<FileReader> inner, MetricsVolume* vol, VolumeIoStats* stats)
      : ForwardingFileReader(std::move(inner)), vol_(vol), stats_(stats) {}
  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    auto t0 = Clock::now();
    auto r = inner_->ReadAt(offset, buf, n);
    if (r.ok()) stats_->AddRead(*r, MicrosSince(t0));
    return r;
  }
  Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) override {
    auto r = inner_->ReadAtNoWait(offset, buf, n);
    if (r.ok()) stats_->AddRead(*r, 0);
    return r;
  }
  void CountSent(uint64_t bytes) override {
    stats_->AddRead(bytes, 0);
    inner_->CountSent(bytes);
  }
  Result<std::string> ReadMeta() override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    return inner_->ReadMeta();
  }

 private:
  MetricsVolume* vol_;
  VolumeIoStats* stats_;
};

class MeteredDir : public ForwardingDirHandle {
 public:
  MeteredDir(std::unique_ptr<DirHandle> inner, MetricsVolume* vol, VolumeIoStats* stats)
      : ForwardingDirHandle(std::move(inner)), vol_(vol), stats_(stats) {}
  Result<std::optional<Name>> Next() override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    return inner_->Next();
  }
  Result<DirEntry> StatEntry(const std::string& name) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    return inner_->StatEntry(name);
  }
  Result<std::string> EntryMeta(const std::string& name) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    return inner_->EntryMeta(name);
  }
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    SLUICE_ASSIGN_OR_RETURN(auto f, inner_->OpenFile(name));
    return std::shared_ptr<FileReader>(std::make_shared<MeteredReader>(std::move(f), vol_, stats_));
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    SLUICE_ASSIGN_OR_RETURN(auto d, inner_->OpenSubdir(name));
    return std::unique_ptr<DirHandle>(new MeteredDir(std::move(d), vol_, stats_));
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdirFrom(const std::string& name,
                                                    const ListFrom& from) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    SLUICE_ASSIGN_OR_RETURN(auto d, inner_->OpenSubdirFrom(name, from));
    return std::unique_ptr<DirHandle>(new MeteredDir(std::move(d), vol_, stats_));
  }

 private:
  MetricsVolume* vol_;
  VolumeIoStats* stats_;
};

class MeteredWriter : public ForwardingStagingWriter {
 public:
  MeteredWriter(std::unique_ptr<StagingWriter> inner, MetricsVolume* vol, VolumeIoStats* stats)
      : ForwardingStagingWriter(std::move(inner)), vol_(vol), stats_(stats) {}
  Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) override {
    *written = 0;
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    auto t0 = Clock::now();
    Status st = inner_->WriteAt(offset, data, n, written);
    stats_->AddWrite(*written, MicrosSince(t0));
    return st;
  }
  Status CopyFrom(FileReader& src, uint64_t src_offset, uint64_t n, uint64_t at) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    return inner_->CopyFrom(src, src_offset, n, at);
  }
  Status Rollback(uint64_t offset, bool quota_checked) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    return inner_->Rollback(offset, quota_checked);
  }
  Status Sync(uint64_t offset, bool quota_checked) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    return inner_->Sync(offset, quota_checked);
  }
  Status Commit(const std::vector<std::string>& final_parts) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    auto t0 = Clock::now();
    Status st = inner_->Commit(final_parts);
    vol_->Count(MetricsVolume::Op::kStage, t0, st);
    return st;
  }
  Status Publish(const std::vector<std::string>& final_parts,
                 const std::function<std::string(const DirEntry&)>& meta, bool durable) override {
    MetricsVolume::Operation counted(vol_, /*may_refuse=*/false);
    auto t0 = Clock::now();
    Status st = inner_->Publish(final_parts, meta, durable);
    vol_->Count(MetricsVolume::Op::kStage, t0, st);
    return st;
  }

 private:
  MetricsVolume* vol_;
  VolumeIoStats* stats_;
};

}  // namespace

const char* MetricsVolume::OpName(Op op) {
  switch (op) {
    case Op::kOpen:
      return "open";
    case Op::kStat:
      return "stat";
    case Op::kList:
      return "list";
    case Op::kMkdir:
      return "mkdir";
    case Op::kRename:
      return "rename";
    case Op::kMove:
      return "move";
    case Op::kDelete:
      return "delete";
    case Op::kStage:
      return "stage";
    case Op::kVFolder:
      return "vfolder";
    case Op::kUsage:
      return "usage";
    case Op::kCount:
      break;
  }
  return "other";
}

MetricsVolume::MetricsVolume(std::unique_ptr<Volume> inner, int max_operations)
    : ForwardingVolume(std::move(inner)),
      stats_(&Metrics::Global().Volume(name())),
      max_operations_(max_operations) {
  auto& m = Metrics::Global();
  const std::string vl = fmt::format("volume=\"{}\"", name());
  g_running_ = &m.Gauge("sluice_volume_operations_running",
                        "Operations of a volume that may block on its storage, running now.", vl);
  g_refused_ = &m.Counter("sluice_volume_operations_refused_total",
                          "Operations refused because max-operations of the volume's were "
                          "running (its storage not answering, or overloaded).",
                          vl);
  for (size_t i = 0; i < ops_.size(); ++i) {
    const char* op = OpName(static_cast<Op>(i));
    const std::string labels = fmt::format("volume=\"{}\",op=\"{}\"", name(), op);
    const char* help = "Volume operations by kind and outcome.";
    ops_[i].ok = &m.Counter("sluice_volume_operations_total", help, labels + ",result=\"ok\"");
    ops_[i].failed =
        &m.Counter("sluice_volume_operations_total", help, labels + ",result=\"error\"");
    ops_[i].usec = &m.Counter("sluice_volume_operation_microseconds_total",
                              "Time spent in volume operations, by kind.", labels);
  }
}

bool MetricsVolume::Enter(bool may_refuse) {
  if (!may_refuse || max_operations_ <= 0) {
    // Counted only: one add, never a compare-and-swap loop (a listing counts two calls a key,
    // from every thread at once).
    running_.fetch_add(1, std::memory_order_relaxed);
  } else {
    int now = running_.load(std::memory_order_relaxed);
    do {
      if (now >= max_operations_) {
        g_refused_->fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    } while (!running_.compare_exchange_weak(now, now + 1, std::memory_order_relaxed));
  }
  g_running_->fetch_add(1, std::memory_order_relaxed);
  return true;
}

Status MetricsVolume::CheckVFolder(const VFolderId& vfid) {
  // The first call of most requests: where a volume at its limit refuses them.
  return Admitted([&] { return ForwardingVolume::CheckVFolder(vfid); });
}

Result<uint64_t> MetricsVolume::GetUsedBytes(const VFolderId& vfid) {
  return Admitted([&] { return ForwardingVolume::GetUsedBytes(vfid); });
}

Result<FsUsage> MetricsVolume::GetFsUsage() {
  // Health checks ask this: a statvfs on a hung mount is refused rather than held.
  return Admitted([&] { return ForwardingVolume::GetFsUsage(); });
}

Result<StagingState> MetricsVolume::InspectStaging(const VFolderId& vfid,
                                                   const std::string& session) {
  return Admitted([&] { return ForwardingVolume::InspectStaging(vfid, session); });
}

// Cleanups: counted, never refused.
Status MetricsVolume::DiscardStaging(const VFolderId& vfid, const std::string& session) {
  Operation counted(this, /*may_refuse=*/false);
  return ForwardingVolume::DiscardStaging(vfid, session);
}

StagingSweep MetricsVolume::SweepStaging(const std::optional<VFolderId>& vfid,
                                         std::chrono::seconds age, const StagingRemoved& removed) {
  Operation counted(this, /*may_refuse=*/false);
  return ForwardingVolume::SweepStaging(vfid, age, removed);
}

void MetricsVolume::Leave() {
  running_.fetch_sub(1, std::memory_order_relaxed);
  g_running_->fetch_sub(1, std::memory_order_relaxed);
}

Status MetricsVolume::Busy() const {
  return Status::Busy(fmt::format(
      "volume {}: {} operations are already waiting on its storage (its max-operations); try "
      "again later",
      name(), max_operations_));
}

void MetricsVolume::Count(Op op, Clock::time_point t0, const Status& st) {
  OpCounters& c = ops_[static_cast<size_t>(op)];
  (st.ok() ? c.ok : c.failed)->fetch_add(1, std::memory_order_relaxed);
  c.usec->fetch_add(MicrosSince(t0), std::memory_order_relaxed);
}

Status MetricsVolume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                                    std::optional<uint64_t> initial_limit) {
  return Run(Op::kVFolder, [&] {
    return ForwardingVolume::CreateVFolder(vfid, mode, auto_scope, initial_limit);
  });
}

Result<std::string> MetricsVolume::DetachVFolder(const VFolderId& vfid) {
  // Also a failed clone's cleanup: counted, never refused.
  return Run(
      Op::kVFolder, [&] { return ForwardingVolume::DetachVFolder(vfid); }, /*may_refuse=*/false);
}

Status MetricsVolume::CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                      const TreeUsage& size) {
  return Run(Op::kVFolder, [&] { return ForwardingVolume::CopyVFolderFrom(from, src, dst, size); });
}

Result<TreeUsage> MetricsVolume::GetUsage(const VFolderId& vfid) {
  return Run(Op::kUsage, [&] { return ForwardingVolume::GetUsage(vfid); });
}

Result<TreeUsage> MetricsVolume::GetFreshUsage(const VFolderId& vfid) {
  return Run(Op::kUsage, [&] { return ForwardingVolume::GetFreshUsage(vfid); });
}

Status MetricsVolume::Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
                            bool exist_ok) {
  return Run(Op::kMkdir, [&] { return ForwardingVolume::Mkdir(vfid, relpath, parents, exist_ok); });
}

Status MetricsVolume::Rename(const VFolderId& vfid, std::string_view relpath,
                             std::string_view new_name) {
  return Run(Op::kRename, [&] { return ForwardingVolume::Rename(vfid, relpath, new_name); });
}

Status MetricsVolume::Move(const VFolderId& vfid, std::string_view src, std::string_view dst) {
  return Run(Op::kMove, [&] { return ForwardingVolume::Move(vfid, src, dst); });
}

Status MetricsVolume::DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                                  bool recursive) {
  return Run(Op::kDelete, [&] { return ForwardingVolume::DeleteFiles(vfid, relpaths, recursive); });
}

Result<std::shared_ptr<FileReader>> MetricsVolume::OpenReader(const VFolderId& vfid,
                                                              std::string_view relpath,
                                                              Lookup lookup,
                                                              const LookupHint* hint) {
  auto t0 = Clock::now();
  // A cached-only lookup never blocks (event loops make it): no admission.
  std::optional<Operation> admitted;
  if (lookup != Lookup::kCachedOnly) {
    admitted.emplace(this, /*may_refuse=*/true);
    if (!*admitted) {
      Status busy = Busy();
      Count(Op::kOpen, t0, busy);
      return busy;
    }
  }
  auto f = ForwardingVolume::OpenReader(vfid, relpath, lookup, hint);
  // A cached-only lookup that would need I/O is not a failure: the pool tries again.
  if (f.ok() || f.status().code() != Code::kUnavailable || lookup != Lookup::kCachedOnly)
    Count(Op::kOpen, t0, f.status());
  if (!f.ok()) return f.status();
  return std::shared_ptr<FileReader>(
      std::make_shared<MeteredReader>(std::move(f).value(), this, stats_));
}

Result<DirEntry> MetricsVolume::Stat(const VFolderId& vfid, std::string_view relpath) {
  return Run(Op::kStat, [&] { return ForwardingVolume::Stat(vfid, relpath); });
}

Result<std::unique_ptr<DirHandle>> MetricsVolume::OpenDir(const VFolderId& vfid,
                                                          std::string_view relpath) {
  auto d = Run(Op::kList, [&] { return ForwardingVolume::OpenDir(vfid, relpath); });
  if (!d.ok()) return d.status();
  return std::unique_ptr<DirHandle>(new MeteredDir(std::move(d).value(), this, stats_));
}

Result<std::unique_ptr<DirHandle>> MetricsVolume::OpenDirFrom(const VFolderId& vfid,
                                                              std::string_view relpath,
                                                              const ListFrom& from) {
  auto d = Run(Op::kList, [&] { return ForwardingVolume::OpenDirFrom(vfid, relpath, from); });
  if (!d.ok()) return d.status();
  return std::unique_ptr<DirHandle>(new MeteredDir(std::move(d).value(), this, stats_));
}

Result<std::vector<DirEntry>> MetricsVolume::ListSorted(const VFolderId& vfid,
                                                        std::string_view relpath,
                                                        std::string_view start_after, size_t max) {
  return Run(Op::kList,
             [&] { return ForwardingVolume::ListSorted(vfid, relpath, start_after, max); });
}

Result<std::string> MetricsVolume::CreateStaging(const VFolderId& vfid) {
  return Run(Op::kStage, [&] { return ForwardingVolume::CreateStaging(vfid); });
}

Result<std::unique_ptr<StagingWriter>> MetricsVolume::OpenStaging(const VFolderId& vfid,
                                                                  const std::string& session,
                                                                  std::chrono::milliseconds wait) {
  auto w = Run(Op::kStage, [&] { return ForwardingVolume::OpenStaging(vfid, session, wait); });
  if (!w.ok()) return w.status();
  return std::unique_ptr<StagingWriter>(new MeteredWriter(std::move(w).value(), this, stats_));
}

}  // namespace sluice
