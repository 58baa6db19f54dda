// The btrfs backend (`backend = "btrfs"`). The volume path lies on a btrfs filesystem with
// qgroups enabled (`btrfs quota enable`). Layout as in Backend.AI v3:
//   <mount>/<scope hex>                 a subvolume per quota scope
//   <mount>/<scope hex>/<ab>/<cd>/<rest> a subvolume per vfolder
// The scope's limit lives on a level-1 qgroup (1/<scope subvolume id> unless taken) whose members
// are the qgroups of the scope's vfolder subvolumes, so a write into any vfolder of the scope
// fails with EDQUOT past the limit. The level-1 id is kept in <scope>/.sluice-qgroup.
// Usage comes from the qgroup counters after a (coalesced) transaction commit; same-scope clones
// are snapshots, other clones reflink copies, and both are checked against the limit first.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "volume/btrfs/btrfs_fs.h"
#include "volume/posix_volume.h"
#include "volume/usage_tracker.h"

namespace sluice {

class BtrfsVolume;

// Qgroups the kernel does not let go yet: a deleted subvolume's qgroup lives until the cleaner
// has dropped the subvolume, and a scope's level-1 qgroup until its members are gone. Their ids
// are files in <mount>/.sluice-stale-qgroups/ (so a restart does not lose them), and Reap()
// destroys those the kernel now allows.
class StaleQgroups {
 public:
  explicit StaleQgroups(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  Status Add(uint64_t q);
  void Remove(uint64_t q);
  std::vector<uint64_t> List() const;
  // Best effort: failures are logged and retried at the next call.
  void Reap(int fs_fd, const btrfs::QgroupSysfs& sysfs);

 private:
  std::string dir_;
  std::mutex mu_;
};

class BtrfsQuotaModel : public QuotaModel {
 public:
  explicit BtrfsQuotaModel(BtrfsVolume* vol) : vol_(vol) {}

  std::string ScopePath(const QuotaScopeId& qsid) const override;
  Status CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes) override;
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) override;
  Result<std::optional<uint64_t>> ScopeLimit(const QuotaScopeId& qsid) override;
  Status UpdateScope(const QuotaScopeId& qsid, uint64_t limit_bytes) override;
  Status UnsetQuota(const QuotaScopeId& qsid) override;
  Status DeleteScope(const QuotaScopeId& qsid) override;

  // The level-1 qgroup of an existing scope. A scope subvolume made elsewhere (Backend.AI's own
  // btrfs backend, an interrupted create) gets one now; nullopt for a scope that is a plain
  // directory, which cannot carry a limit.
  Result<std::optional<uint64_t>> ScopeQgroup(const QuotaScopeId& qsid);

  // The file in the scope directory that holds the scope's qgroup id ("1/257").
  static constexpr const char* kQgroupFile = ".sluice-qgroup";
  // A scope's own trash: vfolders that are plain directories in its subvolume wait there.
  static constexpr const char* kScopeTrash = ".sluice-trash";

  // Held shared by every vfolder create from its scope check to its rename into place, and
  // exclusively by DeleteScope from its emptiness check to the (recursive) subvolume delete:
  // a vfolder made in between would be deleted with the scope after its create succeeded.
  // Taken before mu_.
  std::shared_mutex& scope_life() { return scope_life_; }

 private:
  Result<std::optional<uint64_t>> ReadQgroupFile(const QuotaScopeId& qsid) const;
  Status WriteQgroupFile(const QuotaScopeId& qsid, uint64_t q) const;
  // A fresh level-1 qgroup for the scope subvolume `subvol_id`.
  Result<uint64_t> NewScopeQgroup(uint64_t subvol_id);

  BtrfsVolume* vol_;
  std::mutex mu_;  // scope create / adopt / delete
  std::shared_mutex scope_life_;
};

class BtrfsFSOpModel : public PosixFSOpModel {
 public:
  BtrfsFSOpModel(ThreadPool* pool, BtrfsVolume* vol) : PosixFSOpModel(pool), vol_(vol) {}
  // Subvolumes (the path itself or any below it) are deleted as subvolumes, not file by file.
  Status DeleteTree(const std::string& path) override;

 private:
  BtrfsVolume* vol_;
};

class BtrfsVolume : public PosixVolume {
 public:
  BtrfsVolume(VolumeConfig cfg, ThreadPool* scan_pool);

  std::set<std::string> capabilities() const override;
  Status Init() override;
  QuotaModel& quota() override { return quota_; }
  FSOpModel& fsop() override { return btrfs_fsop_; }

  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override;
  // Bytes from the qgroup (fresh); the file count, which btrfs keeps nowhere, from a count of
  // the subvolume's inode items kept like vfs usage (usage_tracker.h): small vfolders are counted
  // per request, large ones answer the kept count, updated by Sluice's writes and recounted in
  // the background. measured_at tells the count's age.
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;
  Result<TreeUsage> GetFreshUsage(const VFolderId& vfid) override;
  Result<uint64_t> GetUsedBytes(const VFolderId& vfid) override;
  // A vfolder that is a plain directory inside its scope's subvolume (made elsewhere) cannot be
  // renamed out of that subvolume (EXDEV): it waits in the scope's own trash,
  // <scope>/.sluice-trash, which EmptyTrash empties too.
  Result<std::string> DetachVFolder(const VFolderId& vfid) override;
  Status EmptyTrash() override;
  Status EmptyTrashOf(const VFolderId& vfid) override;
  // <mount>/<scope hex>/.sluice-trash
  std::string ScopeTrashDir(const std::string& scope_hex) const;
  void AccountWrite(const VFolderId& vfid, int64_t bytes, int64_t entries) override;
  HwInfo GetHwInfo() override;
  Status CloneVFolderInto(const VFolderId& src, const VFolderId& dst) override;

  // <mount>/.sluice-stale-qgroups
  std::string StaleQgroupDir() const;

 private:
  friend class BtrfsQuotaModel;
  friend class BtrfsFSOpModel;

  // Commits the running transaction so that qgroup counters include every write-back and delete
  // that happened before the call. Concurrent callers share one commit.
  Status CommitForUsage();
  // referenced + rsv_data of `q` after CommitForUsage(), and its limit.
  Result<btrfs::QgroupCounters> FreshCounters(uint64_t q);
  // The vfolder root opened for ioctls, and its subvolume id when it is a subvolume.
  struct VFolderRoot {
    UniqueFd fd;
    std::optional<uint64_t> subvol_id;
  };
  Result<VFolderRoot> OpenVFolderForIoctl(const VFolderId& vfid) const;
  // Qgroup bytes plus the file count `count` gives for the vfolder's path.
  Result<TreeUsage> UsageWith(const VFolderId& vfid,
                              Result<TreeUsage> (UsageTracker::*count)(const std::string&));
  // Replaces the empty subvolume `dst` by a snapshot of `src`.
  Status SnapshotInto(int src_fd, const VFolderId& dst, std::optional<uint64_t> dst_qgroup);

  BtrfsQuotaModel quota_;
  BtrfsFSOpModel btrfs_fsop_;
  StaleQgroups stale_;
  UsageTracker inode_counts_;  // file_count per vfolder subvolume (used_bytes unused)
  UniqueFd mount_fd_;
  std::string fsid_;
  btrfs::QgroupSysfs sysfs_;

  std::mutex commit_mu_;
  std::chrono::steady_clock::time_point last_commit_start_{};

  // Bytes promised to clones in flight, per destination qgroup: a clone is checked against the
  // limit together with the clones already running into the same scope.
  std::mutex clone_mu_;
  std::map<uint64_t, uint64_t> clone_reserved_;
};

}  // namespace sluice
