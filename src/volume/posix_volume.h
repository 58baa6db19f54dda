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
  Status EmptyTrashOf(const VFolderId& vfid) override;
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
  Status Rename(const VFolderId& vfid, std::string_view relpath,
                std::string_view new_name) override;
  Status Move(const VFolderId& vfid, std::string_view src, std::string_view dst) override;
  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid, std::string_view relpath,
                                                 Lookup lookup = Lookup::kMayBlock,
                                                 const LookupHint* hint = nullptr) override;
  std::shared_ptr<const LookupHint> PrepareLookup(const VFolderId& vfid,
                                                  std::string_view relpath) const override;
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) override;
  Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                         const TreeUsage& size) override;
  Result<std::string> CreateStaging(const VFolderId& vfid) override;
  Status DiscardStaging(const VFolderId& vfid, const std::string& session) override;
  Result<StagingState> InspectStaging(const VFolderId& vfid, const std::string& session) override;
  Result<std::unique_ptr<StagingWriter>> OpenStaging(const VFolderId& vfid,
                                                     const std::string& session,
                                                     std::chrono::milliseconds wait) override;
  StagingSweep SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                            const StagingRemoved& removed) override;
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                             std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid, std::string_view relpath,
                                                 const ListFrom& from) override;
  Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                           std::string_view start_after, size_t max) override;
  // The vfolder's root directory, opened O_PATH: the directory fd that paths inside the vfolder
  // are resolved beneath (OpenBeneath). kNotFound naming the vfolder when it is missing. With
  // Lookup::kCachedOnly it does no I/O: kUnavailable when the lookup would need some.
  Result<UniqueFd> OpenVFolderRoot(const VFolderId& vfid, Lookup lookup = Lookup::kMayBlock) const;

  // What a write through this volume changed in a vfolder. Backends that maintain usage
  // figures (vfs) or check limits ahead of a lazy kernel (cephfs) keep count; the others ignore
  // it. Every write path of the volume calls it: nothing outside the volume writes.
  virtual void AccountWrite(const VFolderId& vfid, int64_t bytes, int64_t entries) {}
  // Same-volume clone: backends with a faster way (snapshot, reflink) override it.
  virtual Status CloneVFolderInto(const VFolderId& src, const VFolderId& dst);
  Status DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                     bool recursive) override;

  // Calls `fn` with every vfolder directory of the volume (opened O_PATH), its scope's hex
  // ("" for legacy vfolders) and its own hex.
  void ForEachVFolder(const std::function<void(int vfdir, const std::string& scope_hex,
                                               const std::string& vf_hex)>& fn) const;

  // Where detached vfolders wait for deletion: <mount>/.sluice-trash.
  std::string TrashDir() const;
  // DetachVFolder into another trash directory (made when missing), and EmptyTrash of one.
  Result<std::string> DetachVFolderInto(const VFolderId& vfid, const std::string& trash);
  // (`only`: the entries whose names begin so; DetachVFolder names them "<vfolder hex>-...".)
  Status EmptyTrashDir(const std::string& dir, const std::string& only = "");

  // Quota scopes are directories <mount>/<scope hex> on every backend of this kind.
  std::string ScopeDir(const QuotaScopeId& qsid) const;
  // kNotFound naming the scope and the volume when it is missing; kIoError when not a directory.
  Status CheckScopeDir(const QuotaScopeId& qsid) const;
  // Makes the scope's directory; kAlreadyExists when it is there.
  Status MakeScopeDir(const QuotaScopeId& qsid) const;
  // kNotEmpty unless the scope directory holds nothing but the file `bookkeeping` (the backend's
  // own record, e.g. a stored limit); temporary copies of it a crash left are removed.
  Status CheckScopeEmpty(const QuotaScopeId& qsid, std::string_view bookkeeping) const;
  // A quota scope's small bookkeeping file `name` (a stored limit, a qgroup id, a project id):
  // its text (at most 4 KiB), or nullopt when there is none. Written atomically: a crash leaves
  // the old record or the new one.
  Result<std::optional<std::string>> ReadScopeRecord(const QuotaScopeId& qsid,
                                                     std::string_view name) const;
  Status WriteScopeRecord(const QuotaScopeId& qsid, std::string_view name, std::string_view text,
                          mode_t mode = 0600) const;

 protected:
  // The file's whole path from resolved_path_ (empty for the vfolder root or a bad path): what
  // OpenReader opens in one walk that refuses symbolic links.
  std::string DirectPath(const VFolderId& vfid, std::string_view relpath) const;

  VolumeConfig cfg_;
  // cfg_.path with its symbolic links resolved (Init): the one-lookup fast path of OpenReader
  // refuses every symlink on the way, so it starts from here.
  std::string resolved_path_;
  PosixFSOpModel fsop_;
  VolumeIoStats* io_stats_;
  int layout_version_ = 3;
};

}  // namespace sluice
