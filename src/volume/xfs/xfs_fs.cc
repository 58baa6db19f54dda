#include "volume/xfs/xfs_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/dqblk_xfs.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/quota.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "common/fd.h"
#include "common/secrets.h"
#include "common/tree_walk.h"

namespace sluice::xfs {

namespace {

constexpr int kPrjQuota = 2;  // PRJQUOTA of <linux/quota.h>, which clashes with <sys/quota.h>
constexpr uint64_t kBasicBlock = 512;

// Undoes the octal escapes of mountinfo fields ("\040" for a space).
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool ok = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = s[i + k];
        if (c < '0' || c > '7') ok = false;
        v = v * 8 + (c - '0');
      }
      if (ok) {
        out += static_cast<char>(v);
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

}  // namespace

Result<ProjectAttr> GetProject(int fd) {
  struct fsxattr fa {};
  if (::ioctl(fd, FS_IOC_FSGETXATTR, &fa) != 0)
    return Status::FromErrno(errno, "FS_IOC_FSGETXATTR");
  return ProjectAttr{fa.fsx_projid, (fa.fsx_xflags & FS_XFLAG_PROJINHERIT) != 0};
}

Status SetProject(int fd, uint32_t project_id, bool inherit) {
  struct fsxattr fa {};
  if (::ioctl(fd, FS_IOC_FSGETXATTR, &fa) != 0)
    return Status::FromErrno(errno, "FS_IOC_FSGETXATTR");
  fa.fsx_projid = project_id;
  if (inherit) fa.fsx_xflags |= FS_XFLAG_PROJINHERIT;
  if (::ioctl(fd, FS_IOC_FSSETXATTR, &fa) != 0)
    return Status::FromErrno(errno, fmt::format("FS_IOC_FSSETXATTR (project id {})", project_id));
  return Status::Ok();
}

Status SetProjectTree(int dirfd, uint32_t project_id, const std::string& where) {
  SLUICE_RETURN_IF_ERROR(SetProject(dirfd, project_id, true).WithContext(where));
  TreeVisitor v;
  v.entry = [project_id](const WalkEntry& e) -> Result<WalkAction> {
    if (e.type == DT_DIR) return WalkAction::kDescend;  // set on entering
    if (e.type != DT_REG) return WalkAction::kSkip;     // symlinks, sockets: no project id
    int fd = ::openat(e.dirfd, e.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT || errno == ELOOP || errno == ENXIO) return WalkAction::kSkip;
      return Status::FromErrno(errno, fmt::format("open '{}'", e.name));
    }
    UniqueFd file(fd);
    SLUICE_RETURN_IF_ERROR(SetProject(file.get(), project_id, false).WithContext(e.name));
    return WalkAction::kSkip;
  };
  v.enter = [project_id](const WalkEntry& e, int fd) -> Status {
    return SetProject(fd, project_id, true).WithContext(e.name);
  };
  return WalkTree(dirfd, v).WithContext(where);
}

Result<std::string> BlockDevice(const std::string& path) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0)
    return Status::FromErrno(errno, fmt::format("stat '{}'", path));
  std::string want = fmt::format("{}:{}", major(sb.st_dev), minor(sb.st_dev));
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return Status::FromErrno(errno, "read /proc/self/mountinfo");
  std::string line;
  std::string found;
  while (std::getline(in, line)) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    std::istringstream ls(line);
    std::string id, parent, devno;
    ls >> id >> parent >> devno;
    if (devno != want) continue;
    std::string tok;
    while (ls >> tok && tok != "-") {
    }
    std::string fstype, source;
    ls >> fstype >> source;
    if (!source.empty()) found = Unescape(source);  // the last match is the one on top
  }
  if (found.empty() || found[0] != '/')
    return Status(
        Code::kNotFound,
        fmt::format("no block device for '{}' (device {}) in /proc/self/mountinfo", path, want));
  return found;
}

Result<QuotaState> GetQuotaState(const std::string& device) {
  struct fs_quota_statv st {};
  st.qs_version = FS_QSTATV_VERSION1;
  if (::quotactl(QCMD(Q_XGETQSTATV, kPrjQuota), device.c_str(), 0,
                 reinterpret_cast<caddr_t>(&st)) != 0)
    return Status::FromErrno(errno, fmt::format("quotactl(Q_XGETQSTATV, PRJQUOTA) on {}", device));
  QuotaState s;
  s.accounting = (st.qs_flags & FS_QUOTA_PDQ_ACCT) != 0;
  s.enforcing = (st.qs_flags & FS_QUOTA_PDQ_ENFD) != 0;
  return s;
}

Result<ProjectQuota> GetProjectQuota(const std::string& device, uint32_t project_id) {
  struct fs_disk_quota d {};
  if (::quotactl(QCMD(Q_XGETQUOTA, kPrjQuota), device.c_str(), static_cast<int>(project_id),
                 reinterpret_cast<caddr_t>(&d)) != 0) {
    // A project with no usage and no limit has no quota record yet.
    if (errno == ENOENT || errno == ESRCH) return ProjectQuota{};
    return Status::FromErrno(
        errno, fmt::format("quotactl(Q_XGETQUOTA) for project {} on {}", project_id, device));
  }
  return ProjectQuota{d.d_bcount * kBasicBlock, d.d_blk_hardlimit * kBasicBlock};
}

Status SetProjectLimit(const std::string& device, uint32_t project_id, uint64_t hard_limit_bytes) {
  struct fs_disk_quota d {};
  d.d_version = FS_DQUOT_VERSION;
  d.d_id = project_id;
  d.d_flags = FS_PROJ_QUOTA;
  d.d_fieldmask = FS_DQ_BHARD | FS_DQ_BSOFT;
  d.d_blk_hardlimit = (hard_limit_bytes + kBasicBlock - 1) / kBasicBlock;
  d.d_blk_softlimit = 0;
  if (::quotactl(QCMD(Q_XSETQLIM, kPrjQuota), device.c_str(), static_cast<int>(project_id),
                 reinterpret_cast<caddr_t>(&d)) != 0)
    return Status::FromErrno(
        errno, fmt::format("quotactl(Q_XSETQLIM) for project {} on {}", project_id, device));
  return Status::Ok();
}

bool ReflinkWorks(const std::string& dir) {
  std::string a = fmt::format("{}/.sluice-reflink-probe-{}", dir, RandomHexString(6));
  std::string b = a + ".clone";
  int sfd = ::open(a.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (sfd < 0) return false;
  UniqueFd src(sfd);
  std::string block(4096, 'x');
  bool ok = ::write(sfd, block.data(), block.size()) == static_cast<ssize_t>(block.size()) &&
            ::fsync(sfd) == 0;
  int dfd = ok ? ::open(b.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
  if (dfd >= 0) {
    ok = ::ioctl(dfd, FICLONE, sfd) == 0;
    ::close(dfd);
  } else {
    ok = false;
  }
  ::unlink(b.c_str());
  ::unlink(a.c_str());
  return ok;
}

}  // namespace sluice::xfs
