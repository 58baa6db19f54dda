// An in-memory volume (`backend = "mem"`): quota scopes, vfolders, files, directories and
// upload staging, all in this process's memory and gone when it exits. It exists for hermetic
// tests of everything above the Volume interface (services, APIs, decorators) and as the
// reference a non-POSIX backend can be compared with: it runs the interface conformance
// suite. It has no symbolic links, no mount paths (MountPath is kUnsupported) and a capacity
// from options.capacity (default 1 GiB).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/config.h"
#include "volume/volume.h"

namespace sluice {

class MemVolume : public Volume {
 public:
  MemVolume(VolumeConfig cfg, uint64_t capacity);
  ~MemVolume() override;

  const std::string& name() const override { return cfg_.name; }
  const std::string& backend() const override { return cfg_.backend; }
  const std::string& path() const override { return cfg_.path; }
  const std::string& fsprefix() const override { return cfg_.fsprefix; }
  std::set<std::string> capabilities() const override;
  Status Init() override { return Status::Ok(); }
  QuotaModel& quota() override { return *quota_; }
  FSOpModel& fsop() override { return *fsop_; }
  VolumeIoStats& io_stats() override { return *io_stats_; }
  int layout_version() const override { return 3; }

  std::string VFolderPath(const VFolderId& vfid) const override;
  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override;
  Result<std::string> DetachVFolder(const VFolderId& vfid) override;
  Status CheckVFolder(const VFolderId& vfid) override;
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;
  Result<uint64_t> GetUsedBytes(const VFolderId& vfid) override;
  Result<FsUsage> GetFsUsage() override;
  HwInfo GetHwInfo() override;
  Result<std::string> MountPath(const VFolderId& vfid, std::string_view subpath) override;
  Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                         const TreeUsage& size) override;

  Status ValidatePath(const VFolderId& vfid, std::string_view relpath) override;
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
  Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                           std::string_view start_after, size_t max) override;

  Result<std::string> CreateStaging(const VFolderId& vfid) override;
  Status DiscardStaging(const VFolderId& vfid, const std::string& session) override;
  Result<StagingState> InspectStaging(const VFolderId& vfid, const std::string& session) override;
  Result<std::unique_ptr<StagingWriter>> OpenStaging(const VFolderId& vfid,
                                                     const std::string& session,
                                                     std::chrono::milliseconds wait) override;
  StagingSweep SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                            const StagingRemoved& removed) override;

  // Test hook: puts a file (parents created) as another writer would, behind the interface.
  Status PutFile(const VFolderId& vfid, std::string_view relpath, std::string content);

  struct State;  // everything, behind one lock (mem_volume.cc)

 private:
  VolumeConfig cfg_;
  VolumeIoStats* io_stats_;
  std::shared_ptr<State> state_;
  std::unique_ptr<QuotaModel> quota_;
  std::unique_ptr<FSOpModel> fsop_;
};

}  // namespace sluice
