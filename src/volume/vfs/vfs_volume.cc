#include "volume/vfs/vfs_volume.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/dir_reader.h"
#include "common/fs_util.h"
#include "common/json.h"

namespace sluice {

namespace {

// Names of the subdirectories of `dir` (not following symlinks), skipping dot entries.
Result<std::vector<std::string>> ListSubdirs(const std::string& dir) {
  std::vector<std::string> out;
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return out;
    return Status::FromErrno(errno, fmt::format("list '{}'", dir));
  }
  UniqueFd d(fd);
  SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(d.get(), dir));
  for (auto& e : entries) {
    if (e.name[0] == '.') continue;
    bool is_dir = e.type == DT_DIR;
    if (e.type == DT_UNKNOWN) {
      struct stat sb;
      is_dir =
          ::fstatat(d.get(), e.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sb.st_mode);
    }
    if (is_dir) out.push_back(std::move(e.name));
  }
  return out;
}

}  // namespace

std::string VfsQuotaModel::ScopePath(const QuotaScopeId& qsid) const {
  return vol_->ScopeDir(qsid);
}

Status VfsQuotaModel::WriteLimit(const QuotaScopeId& qsid, std::optional<uint64_t> limit) {
  std::string file = ScopePath(qsid) + "/" + kLimitFile;
  if (!limit) {
    if (::unlink(file.c_str()) != 0 && errno != ENOENT)
      return Status::FromErrno(errno, fmt::format("remove '{}'", file));
    return Status::Ok();
  }
  return vol_->WriteScopeRecord(qsid, kLimitFile,
                                nlohmann::json{{"limit_bytes", *limit}}.dump() + "\n");
}

Result<std::optional<uint64_t>> VfsQuotaModel::ReadLimit(const QuotaScopeId& qsid) const {
  SLUICE_ASSIGN_OR_RETURN(auto text, vol_->ReadScopeRecord(qsid, kLimitFile));
  if (!text) return std::optional<uint64_t>();
  auto j = ParseJson(*text, "a stored limit");
  if (!j.ok() || !j->is_object() || !j->contains("limit_bytes") ||
      !(*j)["limit_bytes"].is_number_unsigned())
    return Status(Code::kIoError, fmt::format("'{}/{}' is corrupt", ScopePath(qsid), kLimitFile));
  return std::optional<uint64_t>((*j)["limit_bytes"].get<uint64_t>());
}

Status VfsQuotaModel::CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit) {
  SLUICE_RETURN_IF_ERROR(vol_->MakeScopeDir(qsid));
  if (limit) return WriteLimit(qsid, limit);
  return Status::Ok();
}

Result<QuotaUsage> VfsQuotaModel::DescribeScope(const QuotaScopeId& qsid) {
  QuotaUsage u;
  SLUICE_ASSIGN_OR_RETURN(u.limit_bytes, ScopeLimit(qsid));
  // The scope's vfolders sit at <scope>/<aa>/<bb>/<rest>; the sum of their maintained figures
  // costs a readdir of the hash levels, not a walk of the data.
  std::string base = ScopePath(qsid);
  SLUICE_ASSIGN_OR_RETURN(auto l1, ListSubdirs(base));
  for (const auto& a : l1) {
    SLUICE_ASSIGN_OR_RETURN(auto l2, ListSubdirs(base + "/" + a));
    for (const auto& b : l2) {
      std::string dir = base + "/" + a + "/" + b;
      SLUICE_ASSIGN_OR_RETURN(auto vfolders, ListSubdirs(dir));
      for (const auto& v : vfolders) {
        auto t = usage_->Get(dir + "/" + v);
        if (!t.ok() && t.status().code() == Code::kNotFound) continue;  // deleted meanwhile
        if (!t.ok()) return t.status();
        u.used_bytes += t->used_bytes;
      }
    }
  }
  return u;
}

Result<std::optional<uint64_t>> VfsQuotaModel::ScopeLimit(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  return ReadLimit(qsid);
}

Status VfsQuotaModel::UpdateScope(const QuotaScopeId& qsid, uint64_t limit) {
  Status s = vol_->CheckScopeDir(qsid);
  if (s.code() == Code::kNotFound) {
    s = CreateScope(qsid, std::nullopt);
    if (!s.ok() && s.code() != Code::kAlreadyExists) return s;
  } else if (!s.ok()) {
    return s;
  }
  return WriteLimit(qsid, limit);
}

Status VfsQuotaModel::UnsetQuota(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  return WriteLimit(qsid, std::nullopt);
}

Status VfsQuotaModel::DeleteScope(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  std::string p = ScopePath(qsid);
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeEmpty(qsid, kLimitFile));
  // The limit goes with the directory, or stays: a vfolder made since the check keeps the
  // scope (rmdir fails), and the scope keeps its limit.
  auto before = ReadLimit(qsid);
  SLUICE_RETURN_IF_ERROR(WriteLimit(qsid, std::nullopt));
  if (::rmdir(p.c_str()) != 0) {
    int err = errno;
    if (before.ok() && *before) {
      Status back = WriteLimit(qsid, *before);
      if (!back.ok())
        spdlog::error("quota scope {} lost its limit: {}", qsid.ToString(), back.ToString());
    }
    if (err == ENOTEMPTY || err == EEXIST) return QuotaScopeNotEmpty(qsid);
    return Status::FromErrno(err, fmt::format("delete quota scope {}", qsid.ToString()));
  }
  return Status::Ok();
}

VfsVolume::VfsVolume(VolumeConfig cfg, ThreadPool* scan_pool,
                     std::chrono::milliseconds reconcile_after,
                     std::chrono::microseconds walk_budget)
    : PosixVolume(std::move(cfg), scan_pool),
      usage_([this](const std::string& path) { return fsop_.ScanTree(path); }, reconcile_after,
             walk_budget),
      quota_(this, &usage_) {}

std::set<std::string> VfsVolume::capabilities() const {
  return {kCapVFolder, kCapQuota, kCapMetric};
}

Result<TreeUsage> VfsVolume::GetUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  return usage_.Get(VFolderPath(vfid));
}

Result<TreeUsage> VfsVolume::GetFreshUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  return usage_.Reconcile(VFolderPath(vfid));
}

Status VfsVolume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                                std::optional<uint64_t> initial_limit) {
  SLUICE_RETURN_IF_ERROR(PosixVolume::CreateVFolder(vfid, mode, auto_scope, initial_limit));
  usage_.Set(VFolderPath(vfid), TreeUsage{});
  return Status::Ok();
}

Result<std::string> VfsVolume::DetachVFolder(const VFolderId& vfid) {
  auto r = PosixVolume::DetachVFolder(vfid);
  usage_.Forget(VFolderPath(vfid));
  return r;
}

void VfsVolume::AccountWrite(const VFolderId& vfid, int64_t bytes, int64_t entries) {
  usage_.Add(VFolderPath(vfid), bytes, entries);
}

}  // namespace sluice
