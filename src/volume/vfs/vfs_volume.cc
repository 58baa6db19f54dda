#include "volume/vfs/vfs_volume.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/fs_util.h"

namespace sluice {

namespace {
Status MissingScope(const QuotaScopeId& qsid) {
  return Status(Code::kNotFound, fmt::format("quota scope {} does not exist", qsid.ToString()));
}
}  // namespace

std::string VfsQuotaModel::ScopePath(const QuotaScopeId& qsid) const {
  return mount_ + "/" + qsid.hex;
}

Status VfsQuotaModel::CheckScope(const QuotaScopeId& qsid) const {
  struct stat sb;
  if (::stat(ScopePath(qsid).c_str(), &sb) != 0) {
    if (errno == ENOENT) return MissingScope(qsid);
    return Status::FromErrno(errno, fmt::format("stat quota scope {}", qsid.ToString()));
  }
  if (!S_ISDIR(sb.st_mode))
    return Status(Code::kIoError, fmt::format("quota scope {}: '{}' is not a directory",
                                              qsid.ToString(), ScopePath(qsid)));
  return Status::Ok();
}

Status VfsQuotaModel::WriteLimit(const QuotaScopeId& qsid, std::optional<uint64_t> limit) {
  std::string file = ScopePath(qsid) + "/" + kLimitFile;
  if (!limit) {
    if (::unlink(file.c_str()) != 0 && errno != ENOENT)
      return Status::FromErrno(errno, fmt::format("remove '{}'", file));
    return Status::Ok();
  }
  return WriteFileAtomic(file, nlohmann::json{{"limit_bytes", *limit}}.dump() + "\n");
}

Result<std::optional<uint64_t>> VfsQuotaModel::ReadLimit(const QuotaScopeId& qsid) const {
  std::string file = ScopePath(qsid) + "/" + kLimitFile;
  std::ifstream in(file);
  if (!in) {
    if (errno == ENOENT) return std::optional<uint64_t>();
    return Status::FromErrno(errno, fmt::format("read '{}'", file));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("limit_bytes") || !j["limit_bytes"].is_number_unsigned())
    return Status(Code::kIoError, fmt::format("'{}' is corrupt", file));
  return std::optional<uint64_t>(j["limit_bytes"].get<uint64_t>());
}

Status VfsQuotaModel::CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit) {
  std::string p = ScopePath(qsid);
  if (::mkdir(p.c_str(), 0755) != 0) {
    if (errno == EEXIST)
      return Status(Code::kAlreadyExists,
                    fmt::format("quota scope {} already exists", qsid.ToString()));
    return Status::FromErrno(errno, fmt::format("create quota scope {}", qsid.ToString()));
  }
  if (limit) return WriteLimit(qsid, limit);
  return Status::Ok();
}

Result<QuotaUsage> VfsQuotaModel::DescribeScope(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(CheckScope(qsid));
  QuotaUsage u;
  SLUICE_ASSIGN_OR_RETURN(u.limit_bytes, ReadLimit(qsid));
  SLUICE_ASSIGN_OR_RETURN(TreeUsage t, fsop_->ScanTree(ScopePath(qsid)));
  u.used_bytes = t.used_bytes;
  // The limit file is Sluice's bookkeeping, not user data.
  struct stat sb;
  std::string file = ScopePath(qsid) + "/" + kLimitFile;
  if (::stat(file.c_str(), &sb) == 0 && u.used_bytes >= static_cast<uint64_t>(sb.st_size))
    u.used_bytes -= static_cast<uint64_t>(sb.st_size);
  return u;
}

Status VfsQuotaModel::UpdateScope(const QuotaScopeId& qsid, uint64_t limit) {
  Status s = CheckScope(qsid);
  if (s.code() == Code::kNotFound) {
    s = CreateScope(qsid, std::nullopt);
    if (!s.ok() && s.code() != Code::kAlreadyExists) return s;
  } else if (!s.ok()) {
    return s;
  }
  return WriteLimit(qsid, limit);
}

Status VfsQuotaModel::UnsetQuota(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(CheckScope(qsid));
  return WriteLimit(qsid, std::nullopt);
}

Status VfsQuotaModel::DeleteScope(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(CheckScope(qsid));
  std::string p = ScopePath(qsid);
  size_t others = 0;
  if (DIR* d = ::opendir(p.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n != "." && n != ".." && n != kLimitFile) ++others;
    }
    ::closedir(d);
  } else {
    return Status::FromErrno(errno, fmt::format("open quota scope {}", qsid.ToString()));
  }
  if (others)
    return Status(
        Code::kNotEmpty,
        fmt::format("quota scope {} still holds vfolders; delete them first", qsid.ToString()));
  SLUICE_RETURN_IF_ERROR(WriteLimit(qsid, std::nullopt));
  if (::rmdir(p.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST)
      return Status(Code::kNotEmpty,
                    fmt::format("quota scope {} still holds vfolders", qsid.ToString()));
    return Status::FromErrno(errno, fmt::format("delete quota scope {}", qsid.ToString()));
  }
  return Status::Ok();
}

VfsVolume::VfsVolume(VolumeConfig cfg, ThreadPool* scan_pool)
    : PosixVolume(std::move(cfg), scan_pool), quota_(cfg_.path, &fsop_) {}

std::set<std::string> VfsVolume::capabilities() const {
  return {kCapVFolder, kCapQuota, kCapMetric};
}

Result<TreeUsage> VfsVolume::GetUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  std::string path = VFolderPath(vfid);
  std::promise<Result<TreeUsage>> promise;
  std::shared_future<Result<TreeUsage>> running;
  {
    std::lock_guard lk(scans_mu_);
    auto it = scans_.find(path);
    if (it != scans_.end()) {
      running = it->second;
    } else {
      scans_.emplace(path, promise.get_future().share());
    }
  }
  if (running.valid()) return running.get();
  Result<TreeUsage> r = fsop_.ScanTree(path);
  {
    std::lock_guard lk(scans_mu_);
    scans_.erase(path);
  }
  promise.set_value(r);
  return r;
}

}  // namespace sluice
