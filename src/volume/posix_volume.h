// Volume behaviour shared by every backend whose vfolders are directories on a mounted
// filesystem (vfs, btrfs, xfs, cephfs...): layout, file operations beneath the vfolder root,
// usage by parallel scan, statvfs. Backends subclass it and supply their QuotaModel.
#pragma once

#include <memory>

#include "common/config.h"
#include "common/thread_pool.h"
#include "volume/posix_fsop.h"
#include "volume/volume.h"

namespace sluice {

class PosixVolume : public Volume {
 public:
  PosixVolume(VolumeConfig cfg, ThreadPool* scan_pool);

  const std::string& name() const override { return cfg_.name; }
  const std::string& backend() const override { return cfg_.backend; }
  const std::string& path() const override { return cfg_.path; }
  const std::string& fsprefix() const override { return cfg_.fsprefix; }

  Status Init() override;
  Status EmptyTrash() override;
  FSOpModel& fsop() override { return fsop_; }
  VolumeIoStats& io_stats() override { return *io_stats_; }
  int layout_version() const override { return layout_version_; }

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

  Status ValidatePath(const VFolderId& vfid, std::string_view relpath) override;
  Status Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
               bool exist_ok) override;
  Result<std::vector<DirEntry>> ListDir(const VFolderId& vfid, std::string_view relpath,
                                        uint64_t limit) override;
  Status Rename(const VFolderId& vfid, std::string_view relpath,
                std::string_view new_name) override;
  Status Move(const VFolderId& vfid, std::string_view src, std::string_view dst) override;
  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid, std::string_view relpath,
                                                 Lookup lookup = Lookup::kMayBlock,
                                                 const LookupHint* hint = nullptr) override;
  std::shared_ptr<const LookupHint> PrepareLookup(const VFolderId& vfid,
                                                  std::string_view relpath) const override;
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                             std::string_view relpath) override;
  Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                           std::string_view start_after, size_t max) override;
  Result<UniqueFd> OpenVFolderRoot(const VFolderId& vfid,
                                   Lookup lookup = Lookup::kMayBlock) const override;
  Status DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                     bool recursive) override;
  Result<std::string> PrepareUpload(const VFolderId& vfid) override;

  // The staging directory of uploads, inside each vfolder.
  static constexpr const char* kUploadDir = ".upload";

  // Where detached vfolders wait for deletion: <mount>/.sluice-trash.
  std::string TrashDir() const;

  // Quota scopes are directories <mount>/<scope hex> on every backend of this kind.
  std::string ScopeDir(const QuotaScopeId& qsid) const;
  // kNotFound naming the scope and the volume when it is missing; kIoError when not a directory.
  Status CheckScopeDir(const QuotaScopeId& qsid) const;
  // Makes the scope's directory; kAlreadyExists when it is there.
  Status MakeScopeDir(const QuotaScopeId& qsid) const;
  // kNotEmpty unless the scope directory holds nothing but the file `bookkeeping` (the backend's
  // own record, e.g. a stored limit).
  Status CheckScopeEmpty(const QuotaScopeId& qsid, std::string_view bookkeeping) const;
  static Status MissingScope(const QuotaScopeId& qsid, const std::string& volume);

 protected:
  VolumeConfig cfg_;
  PosixFSOpModel fsop_;
  VolumeIoStats* io_stats_;
  int layout_version_ = 3;
};

}  // namespace sluice
