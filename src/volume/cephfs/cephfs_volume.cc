#include "volume/cephfs/cephfs_volume.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <fmt/format.h>

namespace sluice {

namespace {

constexpr const char* kMaxBytes = "ceph.quota.max_bytes";
constexpr const char* kRBytes = "ceph.dir.rbytes";
constexpr const char* kREntries = "ceph.dir.rentries";

// A numeric CephFS virtual xattr; nullopt when the attribute is not set (a quota never set).
Result<std::optional<uint64_t>> GetNumberXattr(const std::string& path, const char* name) {
  char buf[64];
  ssize_t n = ::getxattr(path.c_str(), name, buf, sizeof(buf) - 1);
  if (n < 0) {
    if (errno == ENODATA) return std::optional<uint64_t>();
    if (errno == ENOENT) return Status(Code::kNotFound, fmt::format("'{}' does not exist", path));
    if (errno == ENOTSUP || errno == EOPNOTSUPP)
      return Status(Code::kUnsupported,
                    fmt::format("'{}' is not on CephFS (no {} attribute)", path, name), errno);
    return Status::FromErrno(errno, fmt::format("read {} of '{}'", name, path));
  }
  buf[n] = '\0';
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(buf, &end, 10);
  if (n == 0 || errno != 0 || !end || (*end != '\0' && *end != '\n'))
    return Status(Code::kIoError,
                  fmt::format("{} of '{}' is not a number (\"{}\")", name, path, buf));
  return std::optional<uint64_t>(v);
}

}  // namespace

// --------------------------------------------------------------------------- CephfsQuotaModel

std::string CephfsQuotaModel::ScopePath(const QuotaScopeId& qsid) const {
  return vol_->ScopeDir(qsid);
}

Status CephfsQuotaModel::SetLimit(const QuotaScopeId& qsid, uint64_t limit) const {
  // 0 lifts the quota: CephFS has no other way to remove it.
  std::string v = std::to_string(limit);
  if (::setxattr(ScopePath(qsid).c_str(), kMaxBytes, v.data(), v.size(), 0) != 0) {
    int err = errno;
    if (err == EPERM || err == EACCES)
      return Status(Code::kPermissionDenied,
                    fmt::format("setting {} on quota scope {} was refused; the CephFS client "
                                "needs the 'p' flag in its MDS capabilities",
                                kMaxBytes, qsid.ToString()),
                    err);
    return Status::FromErrno(err, fmt::format("set the limit of quota scope {}", qsid.ToString()));
  }
  return Status::Ok();
}

Status CephfsQuotaModel::CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit) {
  std::string p = ScopePath(qsid);
  SLUICE_RETURN_IF_ERROR(vol_->MakeScopeDir(qsid));
  if (limit) {
    Status s = SetLimit(qsid, *limit);
    if (!s.ok()) {
      ::rmdir(p.c_str());  // no half-made scope
      return s;
    }
  }
  return Status::Ok();
}

Result<QuotaUsage> CephfsQuotaModel::DescribeScope(const QuotaScopeId& qsid) {
  QuotaUsage u;
  SLUICE_ASSIGN_OR_RETURN(u.limit_bytes, ScopeLimit(qsid));
  SLUICE_ASSIGN_OR_RETURN(auto rbytes, GetNumberXattr(ScopePath(qsid), kRBytes));
  u.used_bytes = rbytes.value_or(0) + vol_->PendingBytes(qsid.hex);
  return u;
}

Result<std::optional<uint64_t>> CephfsQuotaModel::ScopeLimit(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  SLUICE_ASSIGN_OR_RETURN(auto limit, GetNumberXattr(ScopePath(qsid), kMaxBytes));
  if (limit && *limit > 0) return std::optional<uint64_t>(*limit);
  return std::optional<uint64_t>();
}

Status CephfsQuotaModel::UpdateScope(const QuotaScopeId& qsid, uint64_t limit) {
  Status s = vol_->CheckScopeDir(qsid);
  if (s.code() == Code::kNotFound) {
    Status created = CreateScope(qsid, limit);
    if (created.code() != Code::kAlreadyExists) return created;  // else made meanwhile: set it
  } else {
    SLUICE_RETURN_IF_ERROR(s);
  }
  return SetLimit(qsid, limit);
}

Status CephfsQuotaModel::UnsetQuota(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  return SetLimit(qsid, 0);
}

Status CephfsQuotaModel::DeleteScope(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  std::string p = ScopePath(qsid);
  if (::rmdir(p.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST)
      return Status(
          Code::kNotEmpty,
          fmt::format("quota scope {} still holds vfolders; delete them first", qsid.ToString()));
    return Status::FromErrno(errno, fmt::format("delete quota scope {}", qsid.ToString()));
  }
  std::lock_guard lk(vol_->pending_mu_);
  vol_->pending_.erase(qsid.hex);
  return Status::Ok();
}

// ------------------------------------------------------------------------------- CephfsVolume

CephfsVolume::CephfsVolume(VolumeConfig cfg, ThreadPool* scan_pool,
                           std::chrono::milliseconds pending_window)
    : PosixVolume(std::move(cfg), scan_pool), quota_(this), pending_window_(pending_window) {}

std::set<std::string> CephfsVolume::capabilities() const {
  return {kCapVFolder, kCapQuota, kCapMetric, kCapFastSize};
}

Status CephfsVolume::Init() {
  auto probe = GetNumberXattr(cfg_.path, kRBytes);
  if (!probe.ok() || !probe->has_value())
    return Status(
        Code::kInvalidArgument,
        fmt::format(
            "volume {}: path '{}' is not a CephFS mount: {}", cfg_.name, cfg_.path,
            probe.ok() ? std::string("no ceph.dir.rbytes attribute") : probe.status().message()));
  return PosixVolume::Init();
}

HwInfo CephfsVolume::GetHwInfo() {
  HwInfo info = PosixVolume::GetHwInfo();
  if (info.status == "healthy") {
    auto probe = GetNumberXattr(cfg_.path, kRBytes);
    if (!probe.ok()) {
      info.status = "unavailable";
      info.status_info = fmt::format("CephFS at '{}': {}", cfg_.path, probe.status().message());
    }
  }
  info.metadata["pending_write_window_ms"] = std::to_string(pending_window_.count());
  return info;
}

Result<TreeUsage> CephfsVolume::GetUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  std::string p = VFolderPath(vfid);
  SLUICE_ASSIGN_OR_RETURN(auto bytes, GetNumberXattr(p, kRBytes));
  SLUICE_ASSIGN_OR_RETURN(auto entries, GetNumberXattr(p, kREntries));
  TreeUsage u;
  u.used_bytes = bytes.value_or(0);
  // rentries counts the directory itself; file_count is what lies below it.
  uint64_t n = entries.value_or(0);
  u.file_count = n > 0 ? n - 1 : 0;
  return u;
}

void CephfsVolume::AccountWrite(const VFolderId& vfid, int64_t bytes, int64_t /*entries*/) {
  if (bytes <= 0 || !vfid.scope) return;  // frees are seen by rbytes in time; only growth races
  std::lock_guard lk(pending_mu_);
  pending_[vfid.scope->hex].emplace_back(Clock::now(), static_cast<uint64_t>(bytes));
}

uint64_t CephfsVolume::PendingBytes(const std::string& scope_hex) {
  std::lock_guard lk(pending_mu_);
  auto it = pending_.find(scope_hex);
  if (it == pending_.end()) return 0;
  auto& q = it->second;
  auto horizon = Clock::now() - pending_window_;
  while (!q.empty() && q.front().first < horizon) q.pop_front();
  uint64_t n = 0;
  for (const auto& [when, b] : q) n += b;
  if (q.empty()) pending_.erase(it);
  return n;
}

}  // namespace sluice
