#include "volume/xfs/xfs_volume.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/fs_util.h"

namespace sluice {

namespace {

Result<UniqueFd> OpenDirByPath(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", p));
  return UniqueFd(fd);
}

Result<uint32_t> ParseId(const std::string& text, const std::string& file) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  while (end && (*end == '\n' || *end == ' ')) ++end;
  if (text.empty() || errno != 0 || !end || *end != '\0' || v == 0 || v > UINT32_MAX)
    return Status(Code::kIoError, fmt::format("'{}' is corrupt (\"{}\")", file, text));
  return static_cast<uint32_t>(v);
}

}  // namespace

// ------------------------------------------------------------------------------ XfsQuotaModel

std::string XfsQuotaModel::ScopePath(const QuotaScopeId& qsid) const {
  return vol_->ScopeDir(qsid);
}

Result<std::optional<uint32_t>> XfsQuotaModel::ReadIdFile(const QuotaScopeId& qsid) const {
  SLUICE_ASSIGN_OR_RETURN(auto text, vol_->ReadScopeRecord(qsid, kProjectIdFile));
  if (!text) return std::optional<uint32_t>();
  SLUICE_ASSIGN_OR_RETURN(uint32_t id,
                          ParseId(text->substr(0, 31), ScopePath(qsid) + "/" + kProjectIdFile));
  return std::optional<uint32_t>(id);
}

Status XfsQuotaModel::WriteIdFile(const QuotaScopeId& qsid, uint32_t id) const {
  return vol_->WriteScopeRecord(qsid, kProjectIdFile, fmt::format("{}\n", id), 0644);
}

Result<uint32_t> XfsQuotaModel::ScopeProject(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  if (!vol_->projects_) return 0u;  // scopes are plain directories (see XfsVolume::Init)
  SLUICE_ASSIGN_OR_RETURN(auto id, ReadIdFile(qsid));
  if (id) return *id;
  std::lock_guard lk(mu_);
  SLUICE_ASSIGN_OR_RETURN(id, ReadIdFile(qsid));  // adopted meanwhile
  if (id) return *id;
  SLUICE_ASSIGN_OR_RETURN(uint32_t fresh, vol_->AllocateProjectId());
  std::string p = ScopePath(qsid);
  SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, OpenDirByPath(p));
  // The id on every entry first, the file last: a crash midway is redone at the next use.
  SLUICE_RETURN_IF_ERROR(xfs::SetProjectTree(dir.get(), fresh, p)
                             .WithContext(fmt::format("adopt quota scope {}", qsid.ToString())));
  SLUICE_RETURN_IF_ERROR(WriteIdFile(qsid, fresh));
  spdlog::info("volume {}: adopted quota scope {} as project {}", vol_->name(), qsid.ToString(),
               fresh);
  return fresh;
}

Status XfsQuotaModel::CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit) {
  if (limit && !vol_->limits_enforced()) return vol_->RefuseLimit(qsid);
  std::lock_guard lk(mu_);
  std::string p = ScopePath(qsid);
  SLUICE_RETURN_IF_ERROR(vol_->MakeScopeDir(qsid));
  auto setup = [&]() -> Status {
    if (!vol_->projects_) return Status::Ok();
    SLUICE_ASSIGN_OR_RETURN(uint32_t id, vol_->AllocateProjectId());
    SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, OpenDirByPath(p));
    SLUICE_RETURN_IF_ERROR(xfs::SetProject(dir.get(), id, true).WithContext(p));
    if (limit) SLUICE_RETURN_IF_ERROR(xfs::SetProjectLimit(vol_->device(), id, *limit));
    return WriteIdFile(qsid, id);
  };
  Status s = setup();
  if (!s.ok()) {
    // Leave no half-made scope behind.
    ::unlink((p + "/" + kProjectIdFile).c_str());
    ::unlink((p + "/" + kProjectIdFile + ".tmp").c_str());
    ::rmdir(p.c_str());
    return s.WithContext(fmt::format("create quota scope {}", qsid.ToString()));
  }
  return Status::Ok();
}

Result<QuotaUsage> XfsQuotaModel::DescribeScope(const QuotaScopeId& qsid) {
  SLUICE_ASSIGN_OR_RETURN(uint32_t id, ScopeProject(qsid));
  QuotaUsage u;
  if (vol_->quota_state_.accounting) {
    SLUICE_ASSIGN_OR_RETURN(xfs::ProjectQuota q, xfs::GetProjectQuota(vol_->device(), id));
    u.used_bytes = q.used_bytes;
    if (q.hard_limit_bytes) u.limit_bytes = q.hard_limit_bytes;
    return u;
  }
  // No accounting: walk the scope; the id file is Sluice's bookkeeping, not user data.
  SLUICE_ASSIGN_OR_RETURN(TreeUsage t, vol_->fsop().ScanTree(ScopePath(qsid)));
  u.used_bytes = t.used_bytes;
  struct stat sb;
  std::string file = ScopePath(qsid) + "/" + kProjectIdFile;
  if (::stat(file.c_str(), &sb) == 0 && u.used_bytes >= static_cast<uint64_t>(sb.st_size))
    u.used_bytes -= static_cast<uint64_t>(sb.st_size);
  return u;
}

Result<std::optional<uint64_t>> XfsQuotaModel::ScopeLimit(const QuotaScopeId& qsid) {
  // Without accounting there is no limit (they are refused), and no walk to make for one.
  SLUICE_ASSIGN_OR_RETURN(uint32_t id, ScopeProject(qsid));
  if (!vol_->quota_state_.accounting) return std::optional<uint64_t>();
  SLUICE_ASSIGN_OR_RETURN(xfs::ProjectQuota q, xfs::GetProjectQuota(vol_->device(), id));
  if (q.hard_limit_bytes) return std::optional<uint64_t>(q.hard_limit_bytes);
  return std::optional<uint64_t>();
}

Status XfsQuotaModel::UpdateScope(const QuotaScopeId& qsid, uint64_t limit) {
  if (!vol_->limits_enforced()) return vol_->RefuseLimit(qsid);
  Status s = vol_->CheckScopeDir(qsid);
  if (s.code() == Code::kNotFound) {
    s = CreateScope(qsid, limit);
    if (s.code() != Code::kAlreadyExists) return s;
  } else if (!s.ok()) {
    return s;
  }
  SLUICE_ASSIGN_OR_RETURN(uint32_t id, ScopeProject(qsid));
  return xfs::SetProjectLimit(vol_->device(), id, limit);
}

Status XfsQuotaModel::UnsetQuota(const QuotaScopeId& qsid) {
  SLUICE_ASSIGN_OR_RETURN(uint32_t id, ScopeProject(qsid));
  // Without enforcement no limit was ever set: nothing to lift.
  if (!vol_->limits_enforced()) return Status::Ok();
  return xfs::SetProjectLimit(vol_->device(), id, 0);
}

Status XfsQuotaModel::DeleteScope(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  std::lock_guard lk(mu_);
  std::string p = ScopePath(qsid);
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeEmpty(qsid, kProjectIdFile));
  SLUICE_ASSIGN_OR_RETURN(auto id, ReadIdFile(qsid));
  if (id && vol_->limits_enforced())
    SLUICE_RETURN_IF_ERROR(xfs::SetProjectLimit(vol_->device(), *id, 0));
  std::string file = p + "/" + kProjectIdFile;
  if (::unlink(file.c_str()) != 0 && errno != ENOENT)
    return Status::FromErrno(errno, fmt::format("remove '{}'", file));
  if (::rmdir(p.c_str()) != 0) {
    int err = errno;
    if (id) (void)WriteIdFile(qsid, *id);  // keep the scope whole
    if (err == ENOTEMPTY || err == EEXIST) return QuotaScopeNotEmpty(qsid);
    return Status::FromErrno(err, fmt::format("delete quota scope {}", qsid.ToString()));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------- XfsVolume

XfsVolume::XfsVolume(VolumeConfig cfg, ThreadPool* scan_pool, Kind kind)
    : PosixVolume(std::move(cfg), scan_pool), kind_(kind), quota_(this) {}

std::set<std::string> XfsVolume::capabilities() const {
  std::set<std::string> caps{kCapVFolder, kCapMetric};
  if (limits_enforced()) caps.insert(kCapQuota);
  if (reflink_) caps.insert(kCapFastClone);
  return caps;
}

std::string XfsVolume::ProjectCounterFile() const {
  return cfg_.path + "/.sluice-project-ids";
}

Result<uint32_t> XfsVolume::AllocateProjectId() {
  std::lock_guard lk(counter_mu_);
  std::string file = ProjectCounterFile();
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", file));
  UniqueFd f(fd);
  // flock: other processes (a second sluiced on the same volume) hand out ids from it too.
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) return Status::FromErrno(errno, fmt::format("flock '{}'", file));
  }
  char buf[32];
  ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n < 0) return Status::FromErrno(errno, fmt::format("read '{}'", file));
  uint32_t next = kFirstProjectId;
  if (n > 0) {
    SLUICE_ASSIGN_OR_RETURN(next, ParseId(std::string(buf, static_cast<size_t>(n)), file));
  }
  if (next == UINT32_MAX)
    return Status(Code::kNoSpace, fmt::format("volume {}: project ids exhausted", cfg_.name));
  // Fixed width, so the new value always overwrites the old one whole.
  std::string body = fmt::format("{:010}\n", next + 1);
  if (::pwrite(fd, body.data(), body.size(), 0) != static_cast<ssize_t>(body.size()) ||
      ::fsync(fd) != 0)
    return Status::FromErrno(errno, fmt::format("write '{}'", file));
  return next;
}

Status XfsVolume::RefuseLimit(const QuotaScopeId& qsid) const {
  return Status(Code::kUnsupported,
                fmt::format("volume {}: cannot set a limit on quota scope {}: {}", cfg_.name,
                            qsid.ToString(), degraded_reason_),
                ENOTSUP);
}

Status XfsVolume::Init() {
  SLUICE_RETURN_IF_ERROR(PosixVolume::Init());
  struct statfs sf;
  if (::statfs(cfg_.path.c_str(), &sf) != 0)
    return Status::FromErrno(errno, fmt::format("volume {}: statfs '{}'", cfg_.name, cfg_.path));
  bool right_fs =
      kind_ == Kind::kXfs ? sf.f_type == XFS_SUPER_MAGIC : sf.f_type == EXT4_SUPER_MAGIC;
  if (!right_fs)
    return Status(Code::kInvalidArgument,
                  fmt::format("volume {}: path '{}' is not on an {} filesystem (f_type {:#x})",
                              cfg_.name, cfg_.path, FsName(), static_cast<uint64_t>(sf.f_type)));
  // Project ids must work: they are what a limit would apply to.
  {
    SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenDirByPath(cfg_.path));
    auto attr = xfs::GetProject(root.get());
    if (!attr.ok())
      return attr.status().WithContext(
          fmt::format("volume {}: project ids are not available on '{}'", cfg_.name, cfg_.path));
  }
  // ext4 sets project ids only with the `project` feature, which needs a kernel with quota
  // support to mount at all: without it, scopes are plain directories.
  if (kind_ == Kind::kExt4) {
    std::string probe = cfg_.path + "/.sluice-probe-XXXXXX";
    if (::mkdtemp(probe.data())) {
      auto fd = OpenDirByPath(probe);
      Status set = fd.ok() ? xfs::SetProject(fd->get(), 1, false) : fd.status();
      if (set.ok()) (void)xfs::SetProject(fd->get(), 0, false);
      if (!set.ok() && set.sys_errno() == EOPNOTSUPP) projects_ = false;
      ::rmdir(probe.c_str());
    }
  }
  if (!projects_) {
    degraded_reason_ = fmt::format(
        "the ext4 filesystem of '{}' has no project feature (tune2fs -O project, on a kernel with "
        "quota support); quota scopes are plain directories and limits are not enforced",
        cfg_.path);
    spdlog::warn("volume {}: {}", cfg_.name, degraded_reason_);
    return Status::Ok();
  }
  auto dev = xfs::BlockDevice(cfg_.path);
  if (!dev.ok()) {
    degraded_reason_ = fmt::format(
        "cannot find the block device of '{}' ({}); project ids are set but limits are not "
        "enforced",
        cfg_.path, dev.status().message());
  } else {
    device_ = *dev;
    auto st = xfs::GetQuotaState(device_);
    if (!st.ok()) {
      int err = st.status().sys_errno();
      std::string why =
          err == ENOSYS ? fmt::format("kernel has no {} quota support", FsName())
          : (err == ESRCH || err == ENOENT)
              ? fmt::format("project quotas are off on {} (mount it with prjquota)", device_)
              : fmt::format("cannot read the project quota state of {}", device_);
      degraded_reason_ =
          fmt::format("{} (quotactl: {}); project ids are set but limits are not enforced", why,
                      std::strerror(err));
    } else {
      quota_state_ = *st;
      if (!st->accounting)
        degraded_reason_ = fmt::format(
            "project quota accounting is off on {} (mount it with prjquota); project ids are "
            "set but limits are not enforced",
            device_);
      else if (!st->enforcing)
        degraded_reason_ = fmt::format(
            "project quotas on {} are accounted but not enforced (mounted with pqnoenforce); "
            "limits are not enforced",
            device_);
    }
  }
  if (!degraded_reason_.empty()) spdlog::warn("volume {}: {}", cfg_.name, degraded_reason_);
  reflink_ = kind_ == Kind::kXfs && xfs::ReflinkWorks(cfg_.path);
  return Status::Ok();
}

Status XfsVolume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                                std::optional<uint64_t> initial_limit) {
  if (vfid.scope) {
    auto id = quota_.ScopeProject(*vfid.scope);
    if (!id.ok() && id.status().code() != Code::kNotFound) return id.status();
  }
  return PosixVolume::CreateVFolder(vfid, mode, auto_scope, initial_limit);
}

HwInfo XfsVolume::GetHwInfo() {
  HwInfo info = PosixVolume::GetHwInfo();
  info.metadata["device"] = device_;
  info.metadata["project_quota"] = limits_enforced()         ? "enforced"
                                   : quota_state_.accounting ? "accounted"
                                                             : "unavailable";
  info.metadata["reflink"] = reflink_ ? "true" : "false";
  if (info.status == "healthy" && !degraded_reason_.empty()) {
    info.status = "degraded";
    info.status_info = degraded_reason_;
  }
  return info;
}

}  // namespace sluice
