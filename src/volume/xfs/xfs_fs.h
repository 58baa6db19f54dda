// Thin, typed wrappers over the kernel interfaces of the xfs/ext4 backend: project ids through
// FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR, project quotas through quotactl(2) on the block device
// found in /proc/self/mountinfo (the generic Q_X* commands, which the kernel serves for XFS and
// ext4 alike), reflinks through FICLONE. No command is run and no command output is parsed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace sluice::xfs {

// The project id of the file `fd` (opened for reading; O_PATH descriptors take no ioctls) and
// whether FS_XFLAG_PROJINHERIT is set on it.
struct ProjectAttr {
  uint32_t project_id = 0;
  bool inherit = false;
};
Result<ProjectAttr> GetProject(int fd);
// Sets the project id, and FS_XFLAG_PROJINHERIT when `inherit` (meaningful on directories only).
Status SetProject(int fd, uint32_t project_id, bool inherit);
// Sets `project_id` on the directory `dirfd` (with PROJINHERIT) and every directory and regular
// file below it (symlinks and special files take no ioctls and are left as they are).
Status SetProjectTree(int dirfd, uint32_t project_id, const std::string& where);

// The mount source ("/dev/loop3") of the filesystem holding `path`, from /proc/self/mountinfo.
Result<std::string> BlockDevice(const std::string& path);

// What the kernel says about project quotas on `device` (Q_XGETQSTATV on PRJQUOTA).
struct QuotaState {
  bool accounting = false;
  bool enforcing = false;
};
// An error (usually ENOSYS: the kernel was built without quota support for this filesystem,
// or ESRCH/ENOENT: quotas are off) is returned as a Status carrying that errno.
Result<QuotaState> GetQuotaState(const std::string& device);

struct ProjectQuota {
  uint64_t used_bytes = 0;
  uint64_t hard_limit_bytes = 0;  // 0: none
};
Result<ProjectQuota> GetProjectQuota(const std::string& device, uint32_t project_id);
// Sets the block hard limit (rounded up to 512-byte basic blocks); 0 lifts it.
Status SetProjectLimit(const std::string& device, uint32_t project_id, uint64_t hard_limit_bytes);

// Whether FICLONE works between two files in directory `dir` (made and removed here).
bool ReflinkWorks(const std::string& dir);

}  // namespace sluice::xfs
