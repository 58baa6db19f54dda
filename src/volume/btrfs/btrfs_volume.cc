#include "volume/btrfs/btrfs_volume.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/dir_reader.h"
#include "common/fs_util.h"
#include "common/secrets.h"

namespace sluice {

using btrfs::Qgroup;
using btrfs::QgroupName;

namespace {

// A directory opened for ioctls (O_PATH descriptors do not take ioctls).
Result<UniqueFd> OpenDirAt(int dirfd, const std::string& name, const std::string& what) {
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", what));
  return UniqueFd(fd);
}

// Names in a directory, without "." and "..".
Result<std::vector<std::string>> ListNames(int dirfd, const std::string& what) {
  SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(dirfd, what));
  std::vector<std::string> out;
  out.reserve(entries.size());
  for (auto& e : entries) out.push_back(std::move(e.name));
  return out;
}

std::string_view ModeName(btrfs::QuotaMode m) {
  switch (m) {
    case btrfs::QuotaMode::kFull:
      return "qgroup";
    case btrfs::QuotaMode::kSimple:
      return "squota";
    default:
      return "disabled";
  }
}

}  // namespace

// ------------------------------------------------------------------------------- StaleQgroups

Status StaleQgroups::Add(uint64_t q) {
  std::lock_guard lk(mu_);
  SLUICE_RETURN_IF_ERROR(EnsureDir(dir_, 0700));
  std::string file = fmt::format("{}/{}_{}", dir_, btrfs::QgroupLevel(q), btrfs::QgroupSubid(q));
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("record stale qgroup in '{}'", file));
  ::close(fd);
  return Status::Ok();
}

void StaleQgroups::Remove(uint64_t q) {
  std::string file = fmt::format("{}/{}_{}", dir_, btrfs::QgroupLevel(q), btrfs::QgroupSubid(q));
  ::unlink(file.c_str());
}

std::vector<uint64_t> StaleQgroups::List() const {
  std::vector<uint64_t> out;
  int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return out;
  UniqueFd dir(fd);
  auto names = ListNames(dir.get(), dir_);
  if (!names.ok()) return out;
  for (const auto& n : *names) {
    auto q = btrfs::ParseQgroupName(n);
    if (q.ok()) out.push_back(*q);
  }
  std::sort(out.begin(), out.end());  // level 0 before the level-1 groups they belong to
  return out;
}

void StaleQgroups::Reap(int fs_fd, const btrfs::QgroupSysfs& sysfs) {
  std::lock_guard lk(mu_);
  std::vector<uint64_t> pending = List();
  if (pending.empty()) return;
  // A level-0 qgroup may go once its subvolume is gone entirely (deleted and cleaned up): the
  // kernel refuses (EBUSY) before, and recent kernels remove it by themselves after. A level-1
  // group may go once it has no members left.
  auto subvolume_gone = [&](uint64_t q) -> bool {
    auto alive = btrfs::SubvolumeExists(fs_fd, btrfs::QgroupSubid(q));
    if (!alive.ok()) spdlog::warn("stale qgroup {}: {}", QgroupName(q), alive.status().ToString());
    return alive.ok() && !*alive;
  };
  std::vector<uint64_t> gone, candidates;
  for (uint64_t q : pending) {
    if (!sysfs.Exists(q)) {
      gone.push_back(q);
    } else if (btrfs::QgroupLevel(q) == 0) {
      if (subvolume_gone(q)) candidates.push_back(q);
    } else {
      auto rel = btrfs::GetQgroupRelations(fs_fd, q);
      if (!rel.ok()) {
        spdlog::warn("stale qgroup {}: {}", QgroupName(q), rel.status().ToString());
        continue;
      }
      bool ready = true;
      for (uint64_t child : rel->children) {
        if (btrfs::QgroupLevel(child) == 0 && subvolume_gone(child))
          candidates.push_back(child);
        else
          ready = false;
      }
      if (ready) candidates.push_back(q);
    }
  }
  // Destroying a qgroup whose numbers are not zero makes the kernel mark all accounting
  // inconsistent, and a dropped subvolume's last blocks are accounted only at the next commit:
  // commit after seeing the subvolumes gone, then destroy only qgroups that read zero.
  if (!candidates.empty()) {
    Status c = btrfs::CommitTransaction(fs_fd);
    if (!c.ok()) {
      spdlog::warn("stale qgroups: {}", c.ToString());
      candidates.clear();
    }
  }
  std::sort(candidates.begin(), candidates.end());  // members before their groups
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (uint64_t q : candidates) {
    auto n = sysfs.Read(q);
    if (!n.ok()) {
      if (!sysfs.Exists(q)) gone.push_back(q);
      continue;
    }
    if (n->referenced != 0 || n->exclusive != 0) continue;
    Status s = btrfs::DestroyQgroup(fs_fd, q);
    if (s.ok() || !sysfs.Exists(q)) {
      gone.push_back(q);
    } else if (s.code() != Code::kConflict) {
      spdlog::warn("stale qgroup {}: {}", QgroupName(q), s.ToString());
    }
  }
  for (uint64_t q : gone) {
    Remove(q);
    spdlog::debug("stale qgroup {} is gone", QgroupName(q));
  }
  ::rmdir(dir_.c_str());  // only when empty
}

// ----------------------------------------------------------------------------- BtrfsQuotaModel

std::string BtrfsQuotaModel::ScopePath(const QuotaScopeId& qsid) const {
  return vol_->ScopeDir(qsid);
}

Result<std::optional<uint64_t>> BtrfsQuotaModel::ReadQgroupFile(const QuotaScopeId& qsid) const {
  SLUICE_ASSIGN_OR_RETURN(auto record, vol_->ReadScopeRecord(qsid, kQgroupFile));
  if (!record) return std::optional<uint64_t>();
  std::string text = record->substr(0, record->find_first_of(" \t\r\n"));
  auto q = btrfs::ParseQgroupName(text);
  if (!q.ok() || btrfs::QgroupLevel(*q) == 0)
    return Status(Code::kIoError, fmt::format("'{}/{}' is corrupt: '{}' is not a level-1 qgroup id",
                                              ScopePath(qsid), kQgroupFile, text));
  return std::optional<uint64_t>(*q);
}

Status BtrfsQuotaModel::WriteQgroupFile(const QuotaScopeId& qsid, uint64_t q) const {
  // A crash leaves no file (the scope is adopted again) or a whole one.
  return vol_->WriteScopeRecord(qsid, kQgroupFile, QgroupName(q) + "\n");
}

Result<uint64_t> BtrfsQuotaModel::NewScopeQgroup(uint64_t subvol_id) {
  // 1/<subvolume id> by convention. Subvolume ids can come back after a remount while the qgroup
  // of an earlier scope with that id still waits for cleanup; then the next free slot is used.
  for (uint64_t k = 0; k < 16; ++k) {
    uint64_t q = Qgroup(1, subvol_id + (k << 32));
    Status s = btrfs::CreateQgroup(vol_->mount_fd_.get(), q);
    if (s.ok()) return q;
    if (s.code() != Code::kAlreadyExists) return s;
  }
  return Status(Code::kConflict,
                fmt::format("no free level-1 qgroup id for subvolume {}", subvol_id), EEXIST);
}

Status BtrfsQuotaModel::CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit) {
  std::lock_guard lk(mu_);
  int mfd = vol_->mount_fd_.get();
  Status s = btrfs::CreateSubvolume(mfd, qsid.hex, std::nullopt);
  if (!s.ok()) {
    if (s.code() == Code::kAlreadyExists) return ExistingQuotaScope(qsid);
    return s.WithContext(fmt::format("create quota scope {}", qsid.ToString()));
  }
  std::optional<uint64_t> subvol_id, q;
  auto fail = [&](Status st) {
    // Roll back: the subvolume goes now, its qgroups once the kernel lets them.
    if (subvol_id) (void)vol_->stale_.Add(Qgroup(0, *subvol_id));
    if (q) (void)vol_->stale_.Add(*q);
    Status del = btrfs::DeleteSubvolume(mfd, qsid.hex);
    if (!del.ok())
      spdlog::error("quota scope {}: rollback failed: {}", qsid.ToString(), del.ToString());
    vol_->stale_.Reap(mfd, vol_->sysfs_);
    return st.WithContext(fmt::format("create quota scope {}", qsid.ToString()));
  };
  auto scope = OpenDirAt(mfd, qsid.hex, ScopePath(qsid));
  if (!scope.ok()) return fail(scope.status());
  auto id = btrfs::SubvolumeId(scope->get());
  if (!id.ok()) return fail(id.status());
  subvol_id = *id;
  auto nq = NewScopeQgroup(*id);
  if (!nq.ok()) return fail(nq.status());
  q = *nq;
  // The scope subvolume's own qgroup stays outside: it holds only Sluice's hash directories and
  // this file, and a limit smaller than its metadata must not stop vfolders being created.
  if (Status st = WriteQgroupFile(qsid, *q); !st.ok()) return fail(st);
  if (limit) {
    if (Status st = btrfs::SetQgroupLimit(mfd, *q, *limit); !st.ok()) return fail(st);
  }
  vol_->stale_.Reap(mfd, vol_->sysfs_);
  return Status::Ok();
}

Result<std::optional<uint64_t>> BtrfsQuotaModel::ScopeQgroup(const QuotaScopeId& qsid) {
  SLUICE_ASSIGN_OR_RETURN(std::optional<uint64_t> q, ReadQgroupFile(qsid));
  if (q) return q;
  std::lock_guard lk(mu_);
  SLUICE_ASSIGN_OR_RETURN(q, ReadQgroupFile(qsid));  // created meanwhile
  if (q) return q;
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  int mfd = vol_->mount_fd_.get();
  SLUICE_ASSIGN_OR_RETURN(UniqueFd scope, OpenDirAt(mfd, qsid.hex, ScopePath(qsid)));
  struct stat sb;
  if (::fstat(scope.get(), &sb) != 0)
    return Status::FromErrno(errno, fmt::format("stat quota scope {}", qsid.ToString()));
  if (!btrfs::IsSubvolumeRoot(sb)) return std::optional<uint64_t>();
  // Adopt a scope subvolume made without a level-1 qgroup. Its own qgroup joins the new group,
  // since vfolders made elsewhere may be plain directories inside it, and a limit on it (as
  // Backend.AI's btrfs backend sets one) moves to the group.
  SLUICE_ASSIGN_OR_RETURN(uint64_t id, btrfs::SubvolumeId(scope.get()));
  SLUICE_ASSIGN_OR_RETURN(uint64_t nq, NewScopeQgroup(id));
  auto adopt = [&]() -> Status {
    SLUICE_RETURN_IF_ERROR(btrfs::AssignQgroup(mfd, Qgroup(0, id), nq));
    auto own = vol_->sysfs_.Read(Qgroup(0, id));
    if (own.ok() && own->max_referenced) {
      SLUICE_RETURN_IF_ERROR(btrfs::SetQgroupLimit(mfd, nq, *own->max_referenced));
      SLUICE_RETURN_IF_ERROR(btrfs::SetQgroupLimit(mfd, Qgroup(0, id), std::nullopt));
    }
    return WriteQgroupFile(qsid, nq);
  };
  if (Status st = adopt(); !st.ok()) {
    (void)vol_->stale_.Add(nq);  // unused: destroyed once it has no members
    return st.WithContext(fmt::format("quota scope {}", qsid.ToString()));
  }
  spdlog::info("volume {}: quota scope {} now uses qgroup {}", vol_->name(), qsid.ToString(),
               QgroupName(nq));
  if (vol_->sysfs_.Inconsistent())
    spdlog::warn(
        "volume {}: btrfs qgroup accounting is inconsistent; run `btrfs quota rescan -w {}`",
        vol_->name(), vol_->path());
  return std::optional<uint64_t>(nq);
}

Result<QuotaUsage> BtrfsQuotaModel::DescribeScope(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  SLUICE_ASSIGN_OR_RETURN(std::optional<uint64_t> q, ScopeQgroup(qsid));
  QuotaUsage u;
  if (!q) {  // a plain directory: no qgroup, no limit
    SLUICE_ASSIGN_OR_RETURN(TreeUsage t, vol_->btrfs_fsop_.ScanTree(ScopePath(qsid)));
    u.used_bytes = t.used_bytes;
    return u;
  }
  SLUICE_ASSIGN_OR_RETURN(btrfs::QgroupCounters c, vol_->FreshCounters(*q));
  u.used_bytes = c.referenced + c.rsv_data;
  u.limit_bytes = c.max_referenced;
  return u;
}

Result<std::optional<uint64_t>> BtrfsQuotaModel::ScopeLimit(const QuotaScopeId& qsid) {
  // The limit alone: no walk of a plain directory, no transaction commit for fresh counters.
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  SLUICE_ASSIGN_OR_RETURN(std::optional<uint64_t> q, ScopeQgroup(qsid));
  if (!q) return std::optional<uint64_t>();
  SLUICE_ASSIGN_OR_RETURN(btrfs::QgroupCounters c, vol_->sysfs_.Read(*q));
  return c.max_referenced;
}

Status BtrfsQuotaModel::UpdateScope(const QuotaScopeId& qsid, uint64_t limit) {
  Status s = vol_->CheckScopeDir(qsid);
  if (s.code() == Code::kNotFound) {
    s = CreateScope(qsid, limit);
    if (s.code() != Code::kAlreadyExists) return s;  // created with the limit (or failed)
  } else if (!s.ok()) {
    return s;
  }
  SLUICE_ASSIGN_OR_RETURN(std::optional<uint64_t> q, ScopeQgroup(qsid));
  if (!q)
    return Status(Code::kUnsupported,
                  fmt::format("quota scope {} on volume {} is a plain directory, not a btrfs "
                              "subvolume; it cannot hold a limit",
                              qsid.ToString(), vol_->name()));
  return btrfs::SetQgroupLimit(vol_->mount_fd_.get(), *q, limit)
      .WithContext(fmt::format("quota scope {}", qsid.ToString()));
}

Status BtrfsQuotaModel::UnsetQuota(const QuotaScopeId& qsid) {
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  SLUICE_ASSIGN_OR_RETURN(std::optional<uint64_t> q, ScopeQgroup(qsid));
  if (!q) return Status::Ok();
  return btrfs::SetQgroupLimit(vol_->mount_fd_.get(), *q, std::nullopt)
      .WithContext(fmt::format("quota scope {}", qsid.ToString()));
}

Status BtrfsQuotaModel::DeleteScope(const QuotaScopeId& qsid) {
  std::unique_lock life(scope_life_);
  std::lock_guard lk(mu_);
  SLUICE_RETURN_IF_ERROR(vol_->CheckScopeDir(qsid));
  int mfd = vol_->mount_fd_.get();
  SLUICE_ASSIGN_OR_RETURN(UniqueFd scope, OpenDirAt(mfd, qsid.hex, ScopePath(qsid)));
  SLUICE_ASSIGN_OR_RETURN(auto names, ListNames(scope.get(), ScopePath(qsid)));
  // The qgroup file, and a temporary one a crash left (WriteFileAtomic: "<file>.tmp..."), and
  // the scope's trash once emptied (removed here; one not empty yet keeps the scope).
  const std::string tmp_prefix = std::string(kQgroupFile) + ".tmp";
  for (const auto& n : names) {
    if (n == kScopeTrash) {
      if (::unlinkat(scope.get(), n.c_str(), AT_REMOVEDIR) != 0) return QuotaScopeNotEmpty(qsid);
      continue;
    }
    if (n != kQgroupFile && n.rfind(tmp_prefix, 0) != 0) return QuotaScopeNotEmpty(qsid);
  }
  struct stat sb;
  if (::fstat(scope.get(), &sb) != 0)
    return Status::FromErrno(errno, fmt::format("stat quota scope {}", qsid.ToString()));
  if (!btrfs::IsSubvolumeRoot(sb)) {  // a plain directory
    for (const auto& n : names) ::unlinkat(scope.get(), n.c_str(), 0);
    if (::unlinkat(mfd, qsid.hex.c_str(), AT_REMOVEDIR) != 0)
      return Status::FromErrno(errno, fmt::format("delete quota scope {}", qsid.ToString()));
    return Status::Ok();
  }
  auto q = ReadQgroupFile(qsid);
  if (!q.ok()) spdlog::warn("delete quota scope {}: {}", qsid.ToString(), q.status().ToString());
  SLUICE_ASSIGN_OR_RETURN(uint64_t id, btrfs::SubvolumeId(scope.get()));
  scope.reset();
  // The subvolume disappears at once; the kernel drops its data and then its qgroup later, and
  // the level-1 qgroup can go only after its members (this subvolume's and those of deleted
  // vfolders) are gone. Recorded first, so a crash cannot leak them.
  SLUICE_RETURN_IF_ERROR(vol_->stale_.Add(Qgroup(0, id)));
  if (q.ok() && *q) {
    SLUICE_RETURN_IF_ERROR(vol_->stale_.Add(**q));
    // No limit on a group that is going away (and none inherited by a reused id).
    Status lift = btrfs::SetQgroupLimit(mfd, **q, std::nullopt);
    if (!lift.ok()) spdlog::warn("delete quota scope {}: {}", qsid.ToString(), lift.ToString());
  }
  Status del = btrfs::DeleteSubvolume(mfd, qsid.hex);
  if (!del.ok()) return del.WithContext(fmt::format("delete quota scope {}", qsid.ToString()));
  vol_->stale_.Reap(mfd, vol_->sysfs_);
  return Status::Ok();
}

// ------------------------------------------------------------------------------ BtrfsFSOpModel

Status BtrfsFSOpModel::DeleteTree(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(PathParent p, OpenPathParent(path, O_RDONLY));
  if (!p.dir.valid()) return Status::Ok();  // already gone
  // A subvolume (a vfolder, a snapshot) goes in one ioctl, whatever its size; nested subvolumes
  // go with it.
  auto subvolumes = [this](int parent, const std::string& name) -> Result<bool> {
    struct stat sb;
    if (::fstatat(parent, name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
        !btrfs::IsSubvolumeRoot(sb))
      return false;
    SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, OpenDirAt(parent, name, name));
    auto id = btrfs::SubvolumeId(dir.get());
    dir.reset();
    if (id.ok()) (void)vol_->stale_.Add(Qgroup(0, *id));
    SLUICE_RETURN_IF_ERROR(
        btrfs::DeleteSubvolume(parent, name).WithContext(fmt::format("delete '{}'", name)));
    return true;
  };
  Status s = RemoveTreeAt(p.dir.get(), p.name, nullptr, subvolumes).WithContext(path);
  if (vol_->mount_fd_.valid()) vol_->stale_.Reap(vol_->mount_fd_.get(), vol_->sysfs_);
  return s;
}

// --------------------------------------------------------------------------------- BtrfsVolume

BtrfsVolume::BtrfsVolume(VolumeConfig cfg, ThreadPool* scan_pool)
    : PosixVolume(std::move(cfg), scan_pool),
      quota_(this),
      btrfs_fsop_(scan_pool, this),
      stale_(cfg_.path + "/.sluice-stale-qgroups"),
      inode_counts_(
          [this](const std::string& path) -> Result<TreeUsage> {
            int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", path));
            UniqueFd dir(fd);
            SLUICE_ASSIGN_OR_RETURN(uint64_t id, btrfs::SubvolumeId(dir.get()));
            SLUICE_ASSIGN_OR_RETURN(uint64_t n, btrfs::CountInodes(mount_fd_.get(), id));
            return TreeUsage{n, 0, std::nullopt};
          },
          std::chrono::minutes(1), std::chrono::milliseconds(10)) {}

std::set<std::string> BtrfsVolume::capabilities() const {
  return {kCapVFolder, kCapQuota, kCapMetric, kCapFastSize, kCapFastClone};
}

std::string BtrfsVolume::StaleQgroupDir() const {
  return stale_.dir();
}

Status BtrfsVolume::Init() {
  int fd = ::open(cfg_.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return Status::FromErrno(errno, fmt::format("volume {}: path '{}'", cfg_.name, cfg_.path));
  mount_fd_.reset(fd);
  SLUICE_ASSIGN_OR_RETURN(bool on_btrfs, btrfs::IsBtrfs(fd));
  if (!on_btrfs)
    return Status(Code::kInvalidArgument,
                  fmt::format("volume {}: path '{}' is not on a btrfs filesystem (backend = "
                              "\"btrfs\" needs one)",
                              cfg_.name, cfg_.path));
  SLUICE_ASSIGN_OR_RETURN(fsid_, btrfs::FilesystemUuid(fd));
  sysfs_ = btrfs::QgroupSysfs(fsid_);
  switch (sysfs_.Mode()) {
    case btrfs::QuotaMode::kDisabled:
      return Status(Code::kInvalidArgument,
                    fmt::format("volume {}: quotas are not enabled on the btrfs filesystem at "
                                "'{}'; run `btrfs quota enable {}`",
                                cfg_.name, cfg_.path, cfg_.path));
    case btrfs::QuotaMode::kSimple:
      return Status(Code::kInvalidArgument,
                    fmt::format("volume {0}: the btrfs filesystem at '{1}' uses simple quotas, "
                                "which do not charge snapshots and reflinks to their owner; "
                                "enable full qgroup accounting (`btrfs quota disable {1}` then "
                                "`btrfs quota enable {1}`)",
                                cfg_.name, cfg_.path));
    default:
      break;
  }
  if (sysfs_.Inconsistent())
    spdlog::warn(
        "volume {}: btrfs qgroup accounting is inconsistent; run `btrfs quota rescan -w {}`",
        cfg_.name, cfg_.path);
  // (Leftovers of interrupted deletes go as subvolumes: EmptyTrash uses this volume's fsop.)
  SLUICE_RETURN_IF_ERROR(PosixVolume::Init());
  stale_.Reap(mount_fd_.get(), sysfs_);
  return Status::Ok();
}

Status BtrfsVolume::CommitForUsage() {
  auto arrived = std::chrono::steady_clock::now();
  std::lock_guard lk(commit_mu_);
  // A commit that started after this call arrived covers it.
  if (last_commit_start_ >= arrived) return Status::Ok();
  auto start = std::chrono::steady_clock::now();
  SLUICE_RETURN_IF_ERROR(btrfs::CommitTransaction(mount_fd_.get())
                             .WithContext(fmt::format("volume {}: commit", cfg_.name)));
  last_commit_start_ = start;
  return Status::Ok();
}

Result<btrfs::QgroupCounters> BtrfsVolume::FreshCounters(uint64_t q) {
  SLUICE_RETURN_IF_ERROR(CommitForUsage());
  return sysfs_.Read(q);
}

Result<BtrfsVolume::VFolderRoot> BtrfsVolume::OpenVFolderForIoctl(const VFolderId& vfid) const {
  int fd = ::open(VFolderPath(vfid).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP)
      return MissingVFolder(vfid, cfg_.name);
    return Status::FromErrno(errno, fmt::format("open vfolder {}", vfid.ToString()));
  }
  VFolderRoot r;
  r.fd.reset(fd);
  struct stat sb;
  if (::fstat(fd, &sb) != 0)
    return Status::FromErrno(errno, fmt::format("stat vfolder {}", vfid.ToString()));
  if (btrfs::IsSubvolumeRoot(sb)) {
    SLUICE_ASSIGN_OR_RETURN(r.subvol_id, btrfs::SubvolumeId(fd));
  }
  return r;
}

Status BtrfsVolume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                                  std::optional<uint64_t> initial_limit) {
  if (mode & ~07777u)
    return Status(Code::kInvalidArgument, fmt::format("mode {:o} is not a permission mode", mode));
  std::string base = cfg_.path;
  std::optional<uint64_t> scope_q;
  std::shared_lock<std::shared_mutex> life;  // the scope stays until the vfolder is in place
  if (vfid.scope) {
    life = std::shared_lock(quota_.scope_life());
    std::string scope_path = quota_.ScopePath(*vfid.scope);
    struct stat sb;
    if (::stat(scope_path.c_str(), &sb) != 0) {
      if (errno != ENOENT) return Status::FromErrno(errno, fmt::format("stat '{}'", scope_path));
      if (!auto_scope) return MissingQuotaScope(*vfid.scope, cfg_.name);
      Status s = quota_.CreateScope(*vfid.scope, initial_limit);
      if (!s.ok() && s.code() != Code::kAlreadyExists) return s;
    }
    SLUICE_ASSIGN_OR_RETURN(scope_q, quota_.ScopeQgroup(*vfid.scope));
    base = scope_path;
  }
  const std::string& h = vfid.hex;
  std::string l1 = base + "/" + h.substr(0, 2);
  std::string l2 = l1 + "/" + h.substr(2, 2);
  SLUICE_RETURN_IF_ERROR(EnsureDir(l1, 0755));
  SLUICE_RETURN_IF_ERROR(EnsureDir(l2, 0755));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd parent, OpenDirAt(AT_FDCWD, l2, l2));
  std::string name = h.substr(4);
  auto exists = [&] { return ExistingVFolder(vfid, cfg_.name); };
  struct stat sb;
  if (::fstatat(parent.get(), name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) == 0) return exists();
  // Made under a hidden name, given its mode, put into the scope's qgroup, then renamed into
  // place: the vfolder appears complete and limited, or not at all. Setting the mode before the
  // subvolume joins the scope's qgroup lets a vfolder be created even in a full scope.
  std::string tmp = fmt::format(".{}.new-{}", name, RandomHexString(6));
  SLUICE_RETURN_IF_ERROR(btrfs::CreateSubvolume(parent.get(), tmp, std::nullopt)
                             .WithContext(fmt::format("create vfolder {}", vfid.ToString())));
  auto fail = [&](Status st) {
    Status del = btrfs::DeleteSubvolume(parent.get(), tmp);
    if (!del.ok()) spdlog::error("create vfolder {}: {}", vfid.ToString(), del.ToString());
    return st;
  };
  std::string ctx = fmt::format("create vfolder {}", vfid.ToString());
  // The exact mode, whatever the umask.
  if (::fchmodat(parent.get(), tmp.c_str(), mode, 0) != 0)
    return fail(Status::FromErrno(errno, ctx + ": chmod"));
  if (scope_q) {
    auto sub = OpenDirAt(parent.get(), tmp, l2 + "/" + tmp);
    if (!sub.ok()) return fail(sub.status().WithContext(ctx));
    auto id = btrfs::SubvolumeId(sub->get());
    if (!id.ok()) return fail(id.status().WithContext(ctx));
    // A new, empty subvolume: the kernel moves its numbers into the group exactly.
    if (Status st = btrfs::AssignQgroup(mount_fd_.get(), Qgroup(0, *id), *scope_q); !st.ok())
      return fail(st.WithContext(ctx));
  }
  if (RenameNoReplace(parent.get(), tmp.c_str(), parent.get(), name.c_str()) != 0) {
    if (errno == EEXIST) return fail(exists());
    return fail(Status::FromErrno(errno, ctx + ": rename into place"));
  }
  return Status::Ok();
}

Result<TreeUsage> BtrfsVolume::UsageWith(
    const VFolderId& vfid, Result<TreeUsage> (UsageTracker::*count)(const std::string&)) {
  SLUICE_ASSIGN_OR_RETURN(VFolderRoot r, OpenVFolderForIoctl(vfid));
  if (!r.subvol_id) return PosixVolume::GetUsage(vfid);  // a plain directory (made elsewhere)
  SLUICE_ASSIGN_OR_RETURN(btrfs::QgroupCounters c, FreshCounters(Qgroup(0, *r.subvol_id)));
  SLUICE_ASSIGN_OR_RETURN(TreeUsage u, (inode_counts_.*count)(VFolderPath(vfid)));
  u.used_bytes = c.referenced + c.rsv_data;
  return u;
}

Result<TreeUsage> BtrfsVolume::GetUsage(const VFolderId& vfid) {
  return UsageWith(vfid, &UsageTracker::Get);
}

Result<TreeUsage> BtrfsVolume::GetFreshUsage(const VFolderId& vfid) {
  return UsageWith(vfid, &UsageTracker::Reconcile);
}

Result<std::string> BtrfsVolume::DetachVFolder(const VFolderId& vfid) {
  auto r = PosixVolume::DetachVFolder(vfid);
  // (Before 2026-12-03 such a vfolder could not be deleted at all: every delete was 400.)
  if (!r.ok() && r.status().sys_errno() == EXDEV && vfid.scope)
    r = DetachVFolderInto(vfid, ScopeTrashDir(vfid.scope->hex));
  inode_counts_.Forget(VFolderPath(vfid));
  return r;
}

Status BtrfsVolume::EmptyTrashOf(const VFolderId& vfid) {
  Status first = PosixVolume::EmptyTrashOf(vfid);
  if (!vfid.scope) return first;
  Status st = EmptyTrashDir(ScopeTrashDir(vfid.scope->hex), vfid.hex + "-");
  return first.ok() ? st : first;
}

Status BtrfsVolume::EmptyTrash() {
  Status first = PosixVolume::EmptyTrash();
  // The scopes' own trash directories.
  auto names = ListNames(mount_fd_.get(), path());
  if (!names.ok()) return first.ok() ? names.status() : first;
  for (const auto& n : *names) {
    if (!IsLowerHex(n, 32, 32)) continue;
    Status st = EmptyTrashDir(ScopeTrashDir(n));  // (none there: nothing to do)
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

std::string BtrfsVolume::ScopeTrashDir(const std::string& scope_hex) const {
  return fmt::format("{}/{}/{}", path(), scope_hex, BtrfsQuotaModel::kScopeTrash);
}

void BtrfsVolume::AccountWrite(const VFolderId& vfid, int64_t /*bytes*/, int64_t entries) {
  if (entries) inode_counts_.Add(VFolderPath(vfid), 0, entries);
}

Result<uint64_t> BtrfsVolume::GetUsedBytes(const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(VFolderRoot r, OpenVFolderForIoctl(vfid));
  if (!r.subvol_id) {
    SLUICE_ASSIGN_OR_RETURN(TreeUsage u, PosixVolume::GetUsage(vfid));
    return u.used_bytes;
  }
  SLUICE_ASSIGN_OR_RETURN(btrfs::QgroupCounters c, FreshCounters(Qgroup(0, *r.subvol_id)));
  return c.referenced + c.rsv_data;
}

HwInfo BtrfsVolume::GetHwInfo() {
  HwInfo info = PosixVolume::GetHwInfo();
  btrfs::QuotaMode mode = sysfs_.Mode();
  info.metadata["fsid"] = fsid_;
  info.metadata["qgroups"] = ModeName(mode);
  if (info.status == "healthy") {
    if (mode != btrfs::QuotaMode::kFull) {
      info.status = "degraded";
      info.status_info = "btrfs qgroups are not enabled: quota limits are not enforced";
    } else if (sysfs_.Inconsistent()) {
      info.status = "degraded";
      info.status_info = fmt::format(
          "btrfs qgroup accounting is inconsistent: run `btrfs quota rescan -w {}`", cfg_.path);
    }
  }
  return info;
}

Status BtrfsVolume::SnapshotInto(int src_fd, const VFolderId& dst,
                                 std::optional<uint64_t> dst_qgroup) {
  std::string path = VFolderPath(dst);
  size_t slash = path.rfind('/');
  std::string parent_path = path.substr(0, slash);
  std::string name = path.substr(slash + 1);
  SLUICE_ASSIGN_OR_RETURN(UniqueFd parent, OpenDirAt(AT_FDCWD, parent_path, parent_path));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd placeholder, OpenDirAt(parent.get(), name, path));
  SLUICE_ASSIGN_OR_RETURN(uint64_t placeholder_id, btrfs::SubvolumeId(placeholder.get()));
  placeholder.reset();
  // Snapshot beside the (empty) destination, then swap the two atomically: the vfolder never
  // disappears, and a failure leaves the empty destination for the caller to remove.
  std::string tmp = fmt::format(".{}.clone-{}", name, RandomHexString(6));
  SLUICE_RETURN_IF_ERROR(btrfs::CreateSnapshot(src_fd, parent.get(), tmp, dst_qgroup));
  if (::renameat2(parent.get(), tmp.c_str(), parent.get(), name.c_str(), RENAME_EXCHANGE) != 0) {
    Status st = Status::FromErrno(errno, fmt::format("swap snapshot into '{}'", path));
    Status del = btrfs::DeleteSubvolume(parent.get(), tmp);
    if (!del.ok()) spdlog::error("clone into {}: {}", path, del.ToString());
    return st;
  }
  (void)stale_.Add(Qgroup(0, placeholder_id));
  Status del = btrfs::DeleteSubvolume(parent.get(), tmp);
  if (!del.ok()) spdlog::error("clone into {}: remove placeholder: {}", path, del.ToString());
  return Status::Ok();
}

Status BtrfsVolume::CloneVFolderInto(const VFolderId& src, const VFolderId& dst) {
  SLUICE_ASSIGN_OR_RETURN(VFolderRoot s, OpenVFolderForIoctl(src));
  SLUICE_ASSIGN_OR_RETURN(VFolderRoot d, OpenVFolderForIoctl(dst));
  std::optional<uint64_t> dst_q;
  if (dst.scope) {
    SLUICE_ASSIGN_OR_RETURN(dst_q, quota_.ScopeQgroup(*dst.scope));
  }
  SLUICE_ASSIGN_OR_RETURN(uint64_t need, GetUsedBytes(src));

  // btrfs does not stop a snapshot or a reflink at a qgroup limit: check first, counting the
  // clones already running into the same scope.
  struct Reservation {
    BtrfsVolume* vol = nullptr;
    uint64_t q = 0, bytes = 0;
    ~Reservation() {
      if (!vol) return;
      std::lock_guard lk(vol->clone_mu_);
      if ((vol->clone_reserved_[q] -= bytes) == 0) vol->clone_reserved_.erase(q);
    }
  } reservation;
  if (dst_q) {
    std::lock_guard lk(clone_mu_);
    SLUICE_ASSIGN_OR_RETURN(btrfs::QgroupCounters c, FreshCounters(*dst_q));
    uint64_t used = c.referenced + c.rsv_data + clone_reserved_[*dst_q];
    if (c.max_referenced && used + need > *c.max_referenced)
      return Status(
          Code::kQuotaExceeded,
          fmt::format("clone needs {} bytes; quota scope {} has {} of {} left", need,
                      dst.scope->ToString(),
                      *c.max_referenced > used ? *c.max_referenced - used : 0, *c.max_referenced));
    clone_reserved_[*dst_q] += need;
    reservation.vol = this;
    reservation.q = *dst_q;
    reservation.bytes = need;
  }

  // A snapshot is O(1), but the kernel keeps qgroup numbers exact only when the snapshot joins
  // the same qgroups as its source (a clone within one scope); elsewhere it would mark accounting
  // inconsistent until a full rescan. Other clones are reflink copies into the new subvolume:
  // time in proportion to metadata, and every shared extent is charged to the destination.
  if (s.subvol_id && d.subvol_id) {
    SLUICE_ASSIGN_OR_RETURN(btrfs::QgroupRelations rel,
                            btrfs::GetQgroupRelations(mount_fd_.get(), Qgroup(0, *s.subvol_id)));
    std::vector<uint64_t> want;
    if (dst_q) want.push_back(*dst_q);
    std::sort(rel.parents.begin(), rel.parents.end());
    if (rel.parents == want) return SnapshotInto(s.fd.get(), dst, dst_q);
  }
  return btrfs_fsop_.CopyTree(VFolderPath(src), VFolderPath(dst));
}

}  // namespace sluice
