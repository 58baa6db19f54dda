// The volume Backend.AI's manager names "noop" for unmanaged vfolders (those with an
// `unmanaged_path`): it always exists without configuration, is never listed in /volumes, keeps
// nothing (zero usage, empty listings, no quota scopes) and accepts vfolder and file operations
// as no-ops, as the reference storage proxy's NoopVolume does. Uploads are refused rather than
// silently dropped.
//
// Downloads of an unmanaged vfolder are served from its directory (the manager's
// `unmanaged_path`), read-only and beneath that directory, and only when it lies under one of
// the operator's `[sluice] unmanaged-roots`.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "volume/volume.h"

namespace sluice {

class NoopVolume : public Volume {
 public:
  static constexpr const char* kName = "noop";

  NoopVolume(std::vector<std::string> unmanaged_roots, ThreadPool* scan_pool);
  ~NoopVolume() override;

  // The canonical form of `unmanaged_path` (absolute, symlinks resolved) when it is a directory
  // under an allowed root; kPermissionDenied naming the setting otherwise.
  Result<std::string> CheckUnmanaged(const std::string& unmanaged_path) const;
  // A read-only volume whose every vfolder is the directory `canonical` (from CheckUnmanaged):
  // the download path opens files through it, beneath that directory. Kept for the life of the
  // process (one per unmanaged vfolder downloaded from).
  Result<Volume*> Tree(const std::string& canonical);

  const std::string& name() const override { return name_; }
  const std::string& backend() const override { return name_; }
  const std::string& path() const override { return empty_; }
  const std::string& fsprefix() const override { return empty_; }
  std::set<std::string> capabilities() const override { return {}; }
  Status Init() override { return Status::Ok(); }
  QuotaModel& quota() override;
  FSOpModel& fsop() override;
  VolumeIoStats& io_stats() override;
  int layout_version() const override { return 3; }

  std::string VFolderPath(const VFolderId&) const override { return "."; }
  Status CreateVFolder(const VFolderId&, mode_t, bool, std::optional<uint64_t>) override {
    return Status::Ok();
  }
  Result<std::string> DetachVFolder(const VFolderId&) override { return std::string(); }
  Status CheckVFolder(const VFolderId&) override { return Status::Ok(); }
  Result<TreeUsage> GetUsage(const VFolderId&) override { return TreeUsage{}; }
  Result<uint64_t> GetUsedBytes(const VFolderId&) override { return uint64_t{0}; }
  Result<FsUsage> GetFsUsage() override { return FsUsage{}; }
  HwInfo GetHwInfo() override { return HwInfo{}; }
  Result<std::string> MountPath(const VFolderId&, std::string_view) override {
    return std::string(".");
  }
  Status CopyVFolderFrom(Volume&, const VFolderId&, const VFolderId&, const TreeUsage&) override {
    return Status::Ok();
  }
  Status ValidatePath(const VFolderId&, std::string_view) override { return Status::Ok(); }
  Status Mkdir(const VFolderId&, std::string_view, bool, bool) override { return Status::Ok(); }
  Status Rename(const VFolderId&, std::string_view, std::string_view) override {
    return Status::Ok();
  }
  Status Move(const VFolderId&, std::string_view, std::string_view) override {
    return Status::Ok();
  }
  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId&, std::string_view relpath, Lookup,
                                                 const LookupHint*) override;
  Result<DirEntry> Stat(const VFolderId&, std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId&, std::string_view) override;
  Result<std::vector<DirEntry>> ListSorted(const VFolderId&, std::string_view, std::string_view,
                                           size_t) override {
    return std::vector<DirEntry>{};
  }
  Result<std::string> CreateStaging(const VFolderId&) override;
  Status DiscardStaging(const VFolderId&, const std::string&) override { return Status::Ok(); }
  Result<StagingState> InspectStaging(const VFolderId&, const std::string&) override;
  Result<std::unique_ptr<StagingWriter>> OpenStaging(const VFolderId&, const std::string&,
                                                     std::chrono::milliseconds) override;
  StagingSweep SweepStaging(const std::optional<VFolderId>&, std::chrono::seconds,
                            const StagingRemoved&) override {
    return {};
  }
  Status DeleteFiles(const VFolderId&, const std::vector<std::string>&, bool) override {
    return Status::Ok();
  }

 private:
  class Quota;
  class FsOp;
  class TreeVolume;

  const std::string name_ = kName;
  const std::string empty_;
  std::vector<std::string> roots_;  // canonical
  ThreadPool* scan_pool_;
  std::unique_ptr<Quota> quota_;
  std::unique_ptr<FsOp> fsop_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Volume>> trees_;
};

}  // namespace sluice
