// Thin, typed wrappers over the btrfs kernel interfaces the btrfs backend uses: libbtrfsutil for
// subvolumes and transaction commits, the qgroup ioctls for quota groups, BTRFS_IOC_TREE_SEARCH_V2
// for qgroup relations and inode counts, and /sys/fs/btrfs/<fsid>/qgroups/ for live counters.
// No `btrfs` command is run and no command output is parsed. Most calls need CAP_SYS_ADMIN.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sluice::btrfs {

// The inode number of every subvolume's root directory (BTRFS_FIRST_FREE_OBJECTID).
inline constexpr uint64_t kSubvolumeRootIno = 256;

// A qgroup id: the level in the top 16 bits, the id in the low 48 ("1/257").
inline constexpr uint64_t Qgroup(uint16_t level, uint64_t id) {
  return (uint64_t{level} << 48) | (id & ((uint64_t{1} << 48) - 1));
}
inline constexpr uint16_t QgroupLevel(uint64_t q) {
  return static_cast<uint16_t>(q >> 48);
}
inline constexpr uint64_t QgroupSubid(uint64_t q) {
  return q & ((uint64_t{1} << 48) - 1);
}
std::string QgroupName(uint64_t q);  // "1/257"
// Accepts "1/257" and the sysfs spelling "1_257".
Result<uint64_t> ParseQgroupName(std::string_view s);

// kOk(true) when the filesystem holding `fd` is btrfs.
Result<bool> IsBtrfs(int fd);
inline bool IsSubvolumeRoot(const struct stat& sb) {
  return S_ISDIR(sb.st_mode) && sb.st_ino == kSubvolumeRootIno;
}
// The filesystem id as /sys/fs/btrfs/ names it.
Result<std::string> FilesystemUuid(int fd);

// The id of the subvolume holding `fd` (a regular, not O_PATH, descriptor).
Result<uint64_t> SubvolumeId(int fd);
struct SubvolumeInfo {
  uint64_t id = 0;
  std::string uuid;
  std::string parent_uuid;  // empty unless the subvolume is a snapshot
};
Result<SubvolumeInfo> GetSubvolumeInfo(int fd);
// false once subvolume `id` is gone entirely: deleted *and* cleaned up by the kernel.
Result<bool> SubvolumeExists(int fs_fd, uint64_t id);

// Creates subvolume `name` in directory `parent_fd`; its qgroup joins `parent_qgroup` atomically.
Status CreateSubvolume(int parent_fd, const std::string& name,
                       std::optional<uint64_t> parent_qgroup);
// Snapshots the subvolume `src_fd` as `name` in `parent_fd`, joining `parent_qgroup`.
Status CreateSnapshot(int src_fd, int parent_fd, const std::string& name,
                      std::optional<uint64_t> parent_qgroup);
// Deletes subvolume `name` in `parent_fd` and every subvolume beneath it. The space (and the
// subvolume's qgroup) is released later by the kernel's cleaner.
Status DeleteSubvolume(int parent_fd, const std::string& name);

// kAlreadyExists when the qgroup exists.
Status CreateQgroup(int fs_fd, uint64_t q);
// kConflict (EBUSY) while the qgroup has members or its subvolume still exists.
Status DestroyQgroup(int fs_fd, uint64_t q);
Status AssignQgroup(int fs_fd, uint64_t child, uint64_t parent);
// Sets (or, with nullopt, lifts) the limit on referenced bytes.
Status SetQgroupLimit(int fs_fd, uint64_t q, std::optional<uint64_t> max_referenced);
struct QgroupRelations {
  std::vector<uint64_t> parents;   // groups `q` belongs to
  std::vector<uint64_t> children;  // members of `q`
};
Result<QgroupRelations> GetQgroupRelations(int fs_fd, uint64_t q);

// Inodes below the root of subvolume `subvol_id` (files, directories, symlinks...; a hard-linked
// file counts once), counted from the subvolume's B-tree without reading any directory.
Result<uint64_t> CountInodes(int fs_fd, uint64_t subvol_id);

// Commits the running transaction (if any) and waits for it; dirty data is not flushed. Qgroup
// counters are exact for everything written back or deleted before the call.
Status CommitTransaction(int fs_fd);

struct QgroupCounters {
  uint64_t referenced = 0;  // committed
  uint64_t exclusive = 0;   // committed
  uint64_t rsv_data = 0;    // reserved for dirty data not yet in `referenced`
  std::optional<uint64_t> max_referenced;
};
enum class QuotaMode { kDisabled, kFull, kSimple };

// /sys/fs/btrfs/<fsid>/qgroups/: the kernel's live view of every qgroup.
class QgroupSysfs {
 public:
  QgroupSysfs() = default;
  explicit QgroupSysfs(const std::string& fsid);

  const std::string& dir() const { return dir_; }
  QuotaMode Mode() const;
  // The kernel marks accounting inconsistent after changes it cannot follow; a rescan fixes it.
  bool Inconsistent() const;
  bool Exists(uint64_t q) const;
  // kNotFound when the qgroup does not exist.
  Result<QgroupCounters> Read(uint64_t q) const;

 private:
  std::string dir_;
};

}  // namespace sluice::btrfs
