#include "volume/posix_volume.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/dir_reader.h"
#include "common/fs_util.h"
#include "common/path.h"
#include "common/secrets.h"
#include "volume/forwarding_volume.h"
#include "volume/posix_files.h"
#include "volume/posix_staging.h"

namespace sluice {

namespace {

std::string RandomHex(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kHex[rng() & 15];
  return s;
}

}  // namespace

std::string_view EntryTypeName(EntryType t) {
  switch (t) {
    case EntryType::kFile:
      return "FILE";
    case EntryType::kDirectory:
      return "DIRECTORY";
    case EntryType::kSymlink:
      return "SYMLINK";
    default:
      return "FILE";
  }
}

Status StagingWriter::CopyFrom(FileReader& src, uint64_t src_offset, uint64_t n, uint64_t at) {
  std::vector<char> buf(std::min<uint64_t>(n, 1 << 20));
  while (n > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
    SLUICE_ASSIGN_OR_RETURN(size_t got, src.ReadAt(src_offset, buf.data(), want));
    if (got == 0) return Status(Code::kIoError, "the source ended early", EIO);
    size_t written = 0;
    SLUICE_RETURN_IF_ERROR(WriteAt(at, buf.data(), got, &written));
    src_offset += got;
    at += got;
    n -= got;
  }
  return Status::Ok();
}

PosixVolume::PosixVolume(VolumeConfig cfg, ThreadPool* scan_pool)
    : cfg_(std::move(cfg)), fsop_(scan_pool), io_stats_(&Metrics::Global().Volume(cfg_.name)) {
  while (cfg_.path.size() > 1 && cfg_.path.back() == '/') cfg_.path.pop_back();
}

std::string PosixVolume::TrashDir() const {
  return cfg_.path + "/.sluice-trash";
}

std::string PosixVolume::ScopeDir(const QuotaScopeId& qsid) const {
  return cfg_.path + "/" + qsid.hex;
}

Status PosixVolume::CheckScopeDir(const QuotaScopeId& qsid) const {
  struct stat sb;
  if (::stat(ScopeDir(qsid).c_str(), &sb) != 0) {
    if (errno == ENOENT) return MissingQuotaScope(qsid, cfg_.name);
    return Status::FromErrno(errno, fmt::format("stat quota scope {}", qsid.ToString()));
  }
  if (!S_ISDIR(sb.st_mode))
    return Status(Code::kIoError, fmt::format("quota scope {}: '{}' is not a directory",
                                              qsid.ToString(), ScopeDir(qsid)));
  return Status::Ok();
}

Status PosixVolume::MakeScopeDir(const QuotaScopeId& qsid) const {
  if (::mkdir(ScopeDir(qsid).c_str(), 0755) != 0) {
    if (errno == EEXIST) return ExistingQuotaScope(qsid);
    return Status::FromErrno(errno, fmt::format("create quota scope {}", qsid.ToString()));
  }
  return Status::Ok();
}

Result<std::optional<std::string>> PosixVolume::ReadScopeRecord(const QuotaScopeId& qsid,
                                                                std::string_view name) const {
  std::string file = fmt::format("{}/{}", ScopeDir(qsid), name);
  int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return Status::FromErrno(errno, fmt::format("read '{}'", file));
  }
  UniqueFd f(fd);
  std::string text(4096, '\0');
  size_t got = 0;
  for (;;) {
    ssize_t n = ::read(f.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, fmt::format("read '{}'", file));
    if (n == 0 || (got += static_cast<size_t>(n)) == text.size()) break;
  }
  text.resize(got);
  return std::optional<std::string>(std::move(text));
}

Status PosixVolume::WriteScopeRecord(const QuotaScopeId& qsid, std::string_view name,
                                     std::string_view text, mode_t mode) const {
  return WriteFileAtomic(fmt::format("{}/{}", ScopeDir(qsid), name), text, mode);
}

Status PosixVolume::CheckScopeEmpty(const QuotaScopeId& qsid, std::string_view bookkeeping) const {
  int fd = ::open(ScopeDir(qsid).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("open quota scope {}", qsid.ToString()));
  UniqueFd scope(fd);
  SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(scope.get(), ScopeDir(qsid)));
  // The bookkeeping file, and temporary ones of it a crash left (WriteFileAtomic), which go
  // now: the caller's rmdir would fail on them, and the scope could never be deleted.
  const std::string tmp = std::string(bookkeeping) + ".tmp";
  size_t others = 0;
  std::vector<std::string> leftovers;
  for (const auto& e : entries) {
    if (e.name.rfind(tmp, 0) == 0)
      leftovers.push_back(e.name);
    else if (e.name != bookkeeping)
      ++others;
  }
  if (others) return QuotaScopeNotEmpty(qsid);
  for (const auto& name : leftovers)
    if (::unlinkat(scope.get(), name.c_str(), 0) != 0 && errno != ENOENT)
      return Status::FromErrno(errno,
                               fmt::format("quota scope {}: remove '{}'", qsid.ToString(), name));
  return Status::Ok();
}

Status PosixVolume::Init() {
  struct stat sb;
  if (::stat(cfg_.path.c_str(), &sb) != 0)
    return Status::FromErrno(errno, fmt::format("volume {}: path '{}'", cfg_.name, cfg_.path));
  if (!S_ISDIR(sb.st_mode))
    return Status(Code::kInvalidArgument,
                  fmt::format("volume {}: path '{}' is not a directory", cfg_.name, cfg_.path));
  if (char* real = ::realpath(cfg_.path.c_str(), nullptr)) {
    resolved_path_ = real;
    ::free(real);
  }
  std::string version_file = cfg_.path + "/version.txt";
  std::ifstream in(version_file);
  if (in) {
    int v = 0;
    in >> v;
    if (v != 2 && v != 3)
      return Status(Code::kInvalidArgument,
                    fmt::format("volume {}: {} holds layout version '{}'; Sluice knows 2 and 3",
                                cfg_.name, version_file, v));
    layout_version_ = v;
  } else {
    // Backend.AI reads a missing version.txt as layout 2. A new, empty volume starts at 3.
    bool empty = true;
    int fd = ::open(cfg_.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      UniqueFd dir(fd);
      auto entries = ReadDirEntries(dir.get(), cfg_.path);
      if (entries.ok())
        for (const auto& e : *entries)
          if (e.name != ".sluice-trash") empty = false;
    }
    layout_version_ = empty ? 3 : 2;
    if (empty) SLUICE_RETURN_IF_ERROR(WriteFileAtomic(version_file, "3\n", 0644));
  }
  return Status::Ok();
}

Status PosixVolume::EmptyTrash() {
  return EmptyTrashDir(TrashDir());
}

Status PosixVolume::EmptyTrashOf(const VFolderId& vfid) {
  return EmptyTrashDir(TrashDir(), vfid.hex + "-");
}

Status PosixVolume::EmptyTrashDir(const std::string& dir, const std::string& only) {
  // Each detached vfolder separately: one that cannot go does not keep the others.
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, fmt::format("open trash '{}'", dir));
  }
  UniqueFd trash(fd);
  SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(trash.get(), dir));
  Status first;
  for (const auto& e : entries) {
    if (!e.name.starts_with(only)) continue;
    Status st = fsop().DeleteTree(dir + "/" + e.name);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

std::string PosixVolume::VFolderPath(const VFolderId& vfid) const {
  const std::string& h = vfid.hex;
  std::string tail = fmt::format("{}/{}/{}", h.substr(0, 2), h.substr(2, 2), h.substr(4));
  if (vfid.scope) return fmt::format("{}/{}/{}", cfg_.path, vfid.scope->hex, tail);
  return fmt::format("{}/{}", cfg_.path, tail);
}

Result<UniqueFd> PosixVolume::OpenVFolderRoot(const VFolderId& vfid, Lookup lookup) const {
  const int flags = O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW;
  int fd;
  if (lookup == Lookup::kCachedOnly) {
    struct open_how how {};
    how.flags = flags;
    how.resolve = RESOLVE_CACHED;
    fd = static_cast<int>(
        ::syscall(SYS_openat2, AT_FDCWD, VFolderPath(vfid).c_str(), &how, sizeof(how)));
    if (fd < 0 && errno == EAGAIN)
      return Status(Code::kUnavailable,
                    fmt::format("vfolder {} is not in the lookup cache", vfid.ToString()), EAGAIN);
  } else {
    fd = ::open(VFolderPath(vfid).c_str(), flags);
  }
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return MissingVFolder(vfid, cfg_.name);
    return Status::FromErrno(errno, fmt::format("open vfolder {}", vfid.ToString()));
  }
  return UniqueFd(fd);
}

Status PosixVolume::CheckVFolder(const VFolderId& vfid) {
  return OpenVFolderRoot(vfid).status();
}

Status PosixVolume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                                  std::optional<uint64_t> initial_limit) {
  if (mode & ~07777u)
    return Status(Code::kInvalidArgument, fmt::format("mode {:o} is not a permission mode", mode));
  std::string base = cfg_.path;
  if (vfid.scope) {
    std::string scope_path = quota().ScopePath(*vfid.scope);
    struct stat sb;
    if (::stat(scope_path.c_str(), &sb) != 0) {
      if (errno != ENOENT) return Status::FromErrno(errno, fmt::format("stat '{}'", scope_path));
      if (!auto_scope) return MissingQuotaScope(*vfid.scope, cfg_.name);
      Status s = quota().CreateScope(*vfid.scope, initial_limit);
      if (!s.ok() && s.code() != Code::kAlreadyExists) return s;
    }
    base = scope_path;
  }
  const std::string& h = vfid.hex;
  std::string l1 = base + "/" + h.substr(0, 2);
  std::string l2 = l1 + "/" + h.substr(2, 2);
  SLUICE_RETURN_IF_ERROR(EnsureDir(l1, 0755));
  SLUICE_RETURN_IF_ERROR(EnsureDir(l2, 0755));
  std::string final_path = l2 + "/" + h.substr(4);
  if (::mkdir(final_path.c_str(), 0700) != 0) {
    if (errno == EEXIST) return ExistingVFolder(vfid, cfg_.name);
    return Status::FromErrno(errno, fmt::format("create vfolder {}", vfid.ToString()));
  }
  // The exact mode, whatever the umask.
  if (::chmod(final_path.c_str(), mode) != 0)
    return Status::FromErrno(errno, fmt::format("chmod vfolder {}", vfid.ToString()));
  return Status::Ok();
}

Result<std::string> PosixVolume::DetachVFolder(const VFolderId& vfid) {
  return DetachVFolderInto(vfid, TrashDir());
}

Result<std::string> PosixVolume::DetachVFolderInto(const VFolderId& vfid,
                                                   const std::string& trash) {
  std::string p = VFolderPath(vfid);
  SLUICE_RETURN_IF_ERROR(EnsureDir(trash, 0700));
  std::string dst = fmt::format("{}/{}-{}", trash, vfid.hex, RandomHex(8));
  if (RenameNoReplace(AT_FDCWD, p.c_str(), AT_FDCWD, dst.c_str()) != 0) {
    if (errno == ENOENT) return MissingVFolder(vfid, cfg_.name);
    return Status::FromErrno(errno, fmt::format("detach vfolder {}", vfid.ToString()));
  }
  // Tidy the now possibly empty hash directories; failures (not empty) are expected.
  std::string l2 = p.substr(0, p.rfind('/'));
  if (::rmdir(l2.c_str()) == 0) ::rmdir(l2.substr(0, l2.rfind('/')).c_str());
  return dst;
}

Result<TreeUsage> PosixVolume::GetUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  SLUICE_ASSIGN_OR_RETURN(TreeUsage u, fsop_.ScanTree(VFolderPath(vfid)));
  return u;
}

Result<uint64_t> PosixVolume::GetUsedBytes(const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(TreeUsage u, GetUsage(vfid));
  return u.used_bytes;
}

Result<FsUsage> PosixVolume::GetFsUsage() {
  struct statvfs sv;
  if (::statvfs(cfg_.path.c_str(), &sv) != 0)
    return Status::FromErrno(errno, fmt::format("statvfs '{}'", cfg_.path));
  FsUsage u;
  u.capacity_bytes = static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
  u.used_bytes = static_cast<uint64_t>(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
  u.available_bytes = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  return u;
}

HwInfo PosixVolume::GetHwInfo() {
  HwInfo info;
  struct stat sb;
  if (::stat(cfg_.path.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    info.status = "unavailable";
    info.status_info = fmt::format("volume path '{}' is not reachable", cfg_.path);
  } else if (::access(cfg_.path.c_str(), W_OK) != 0) {
    info.status = "degraded";
    info.status_info = fmt::format("volume path '{}' is not writable", cfg_.path);
  }
  info.metadata = {{"backend", cfg_.backend}, {"layout_version", std::to_string(layout_version_)}};
  return info;
}

Result<std::string> PosixVolume::MountPath(const VFolderId& vfid, std::string_view subpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(subpath));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  if (!parts.empty()) {
    // An existing subpath must resolve beneath the vfolder (no symlink out of it).
    auto probe = OpenBeneath(root.get(), subpath, O_PATH);
    if (!probe.ok() && probe.status().code() != Code::kNotFound) return probe.status();
  }
  return VFolderPath(vfid);
}

Status PosixVolume::ValidatePath(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  // Walk down while the components exist; the first escape is the answer.
  for (size_t i = 1; i <= parts.size(); ++i) {
    auto fd = OpenBeneath(root.get(), JoinComponents(parts, i), O_PATH);
    if (fd.ok()) continue;
    if (fd.status().code() == Code::kInvalidPath) return fd.status();
    break;  // missing (or not a directory): nothing below it can escape yet
  }
  return Status::Ok();
}

Status PosixVolume::Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
                          bool exist_ok) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (parts.empty()) return Status(Code::kAlreadyExists, "the vfolder root already exists");
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  size_t first = parents ? 0 : parts.size() - 1;
  for (size_t i = first; i < parts.size(); ++i) {
    std::string parent_rel = JoinComponents(parts, i);
    SLUICE_ASSIGN_OR_RETURN(UniqueFd parent,
                            OpenBeneath(root.get(), parent_rel, O_PATH | O_DIRECTORY));
    bool last = i + 1 == parts.size();
    if (::mkdirat(parent.get(), parts[i].c_str(), 0755) == 0) {
      AccountWrite(vfid, 0, 1);
      continue;
    }
    int err = errno;
    std::string here = JoinComponents(parts, i + 1);
    if (err != EEXIST) return Status::FromErrno(err, fmt::format("mkdir '{}'", here));
    // It exists: it must be a directory that stays beneath the root (a symlink out is refused).
    auto existing = OpenBeneath(root.get(), here, O_PATH | O_DIRECTORY);
    if (!existing.ok()) {
      if (existing.status().code() == Code::kInvalidPath) return existing.status();
      return Status(Code::kAlreadyExists, fmt::format("'{}' exists and is not a directory", here),
                    EEXIST);
    }
    if (last && !exist_ok)
      return Status(Code::kAlreadyExists, fmt::format("'{}' already exists", here), EEXIST);
  }
  return Status::Ok();
}

Status PosixVolume::Rename(const VFolderId& vfid, std::string_view relpath,
                           std::string_view new_name) {
  SLUICE_RETURN_IF_ERROR(ValidateName(new_name));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  SLUICE_ASSIGN_OR_RETURN(ParentRef src, OpenParentBeneath(root.get(), relpath));
  std::string nn(new_name);
  if (RenameNoReplace(src.dir.get(), src.name.c_str(), src.dir.get(), nn.c_str()) != 0)
    return Status::FromErrno(errno, fmt::format("rename '{}' to '{}'", relpath, new_name));
  return Status::Ok();
}

Status PosixVolume::Move(const VFolderId& vfid, std::string_view src, std::string_view dst) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  SLUICE_ASSIGN_OR_RETURN(ParentRef from, OpenParentBeneath(root.get(), src));
  SLUICE_ASSIGN_OR_RETURN(auto dst_parts, SplitRelPath(dst));
  ParentRef to;
  // Moving onto an existing directory moves into it, as mv does.
  auto dst_dir = dst_parts.empty() ? OpenBeneath(root.get(), ".", O_PATH | O_DIRECTORY)
                                   : OpenBeneath(root.get(), dst, O_PATH | O_DIRECTORY);
  if (dst_dir.ok()) {
    to.dir = std::move(dst_dir).value();
    to.name = from.name;
  } else if (dst_dir.status().code() == Code::kNotFound ||
             dst_dir.status().sys_errno() == ENOTDIR) {
    SLUICE_ASSIGN_OR_RETURN(to, OpenParentBeneath(root.get(), dst));
  } else {
    return dst_dir.status();
  }
  if (RenameNoReplace(from.dir.get(), from.name.c_str(), to.dir.get(), to.name.c_str()) != 0)
    return Status::FromErrno(errno, fmt::format("move '{}' to '{}'", src, dst));
  return Status::Ok();
}

namespace {

// The whole path of a file below a vfolder, for one openat2 that may not pass a symbolic link:
// plain directories below the vfolder's directory, with no "..", cannot lead out of it, so this
// opens exactly what the vfolder root plus OpenBeneath would, with one path walk and no root fd.
// Once the path turns out to hold a symbolic link, it is not tried again.
struct PosixLookupHint : LookupHint {
  std::string path;
  mutable std::atomic<bool> via_symlink{false};
};

}  // namespace

std::string PosixVolume::DirectPath(const VFolderId& vfid, std::string_view relpath) const {
  auto parts = SplitRelPath(relpath);
  if (!parts.ok() || parts->empty()) return {};
  std::string vf = VFolderPath(vfid);
  if (!resolved_path_.empty()) vf.replace(0, cfg_.path.size(), resolved_path_);
  vf += '/';
  vf += JoinComponents(*parts, parts->size());
  return vf;
}

std::shared_ptr<const LookupHint> PosixVolume::PrepareLookup(const VFolderId& vfid,
                                                             std::string_view relpath) const {
  std::string path = DirectPath(vfid, relpath);
  if (path.empty()) return nullptr;
  auto h = std::make_shared<PosixLookupHint>();
  h->path = std::move(path);
  return h;
}

Result<std::shared_ptr<FileReader>> PosixVolume::OpenReader(const VFolderId& vfid,
                                                            std::string_view relpath, Lookup lookup,
                                                            const LookupHint* hint) {
  const bool cached = lookup == Lookup::kCachedOnly;
  // O_NONBLOCK: opening a FIFO must not park a thread until a writer shows up (it is refused
  // below as not a regular file; for regular files the flag changes nothing).
  constexpr int kFlags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  // First the one-walk open of the whole path (see PosixLookupHint), with or without a hint:
  // a batch get or an S3 GET opens each file once, and the vfolder root plus the walk beneath
  // it cost two path lookups. Any failure falls to the general path, whose answer is the
  // authoritative one (a symbolic link inside the vfolder, a missing file, a missing vfolder).
  const auto* h = static_cast<const PosixLookupHint*>(hint);
  if (!h || !h->via_symlink.load()) {
    std::string own;
    if (!h) own = DirectPath(vfid, relpath);
    const std::string& path = h ? h->path : own;
    if (!path.empty()) {
      struct open_how how {};
      how.flags = kFlags;
      how.resolve = RESOLVE_NO_SYMLINKS | (cached ? RESOLVE_CACHED : 0);
      long fd = ::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof(how));
      if (fd >= 0) {
        auto r = PosixFileReader::FromFd(UniqueFd(static_cast<int>(fd)), relpath, cached);
        if (r.ok()) return r;
        // Not a regular file: the general path below gives the authoritative answer.
      } else if (errno == ELOOP && h) {
        h->via_symlink = true;
      }
    }
  }
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid, lookup));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd fd, OpenBeneath(root.get(), relpath, kFlags, 0, lookup));
  return PosixFileReader::FromFd(std::move(fd), relpath, cached);
}

Result<DirEntry> PosixVolume::Stat(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  if (parts.empty()) return StatAt(root.get(), "");
  SLUICE_ASSIGN_OR_RETURN(ParentRef parent, OpenParentBeneath(root.get(), relpath));
  auto e = StatAt(parent.dir.get(), parent.name);
  if (!e.ok() && e.status().code() == Code::kNotFound)
    return Status(Code::kNotFound, fmt::format("'{}' does not exist", relpath), ENOENT);
  return e;
}

Result<std::unique_ptr<DirHandle>> PosixVolume::OpenDir(const VFolderId& vfid,
                                                        std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, OpenBeneath(root.get(), relpath, O_RDONLY | O_DIRECTORY));
  return PosixDirHandle::FromFd(std::move(dir), relpath);
}

Result<std::unique_ptr<DirHandle>> PosixVolume::OpenDirFrom(const VFolderId& vfid,
                                                            std::string_view relpath,
                                                            const ListFrom&) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd dir,
                          OpenBeneathNoSymlinks(root.get(), relpath, O_RDONLY | O_DIRECTORY));
  return PosixDirHandle::FromFd(std::move(dir), relpath);
}

Result<std::vector<DirEntry>> PosixVolume::ListSorted(const VFolderId& vfid,
                                                      std::string_view relpath,
                                                      std::string_view start_after, size_t max) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, OpenBeneath(root.get(), relpath, O_RDONLY | O_DIRECTORY));
  SLUICE_ASSIGN_OR_RETURN(DirReader reader, DirReader::Open(dir.get(), relpath));
  // The `max` smallest names after `start_after`, in a max-heap: a page of a huge directory
  // costs memory for the page, not for the directory.
  std::vector<std::string> names;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto e, reader.Next());
    if (!e) break;
    if (e->name <= start_after) continue;
    if (names.size() < max) {
      names.emplace_back(e->name);
      std::push_heap(names.begin(), names.end());
    } else if (max > 0 && e->name < names.front()) {
      std::pop_heap(names.begin(), names.end());
      names.back().assign(e->name);
      std::push_heap(names.begin(), names.end());
    }
  }
  std::sort_heap(names.begin(), names.end());
  std::vector<DirEntry> out;
  for (const auto& n : names) {
    if (out.size() >= max) break;
    auto e = StatAt(dir.get(), n);
    if (!e.ok()) {
      if (e.status().code() == Code::kNotFound) continue;  // removed meanwhile
      return e.status();
    }
    out.push_back(std::move(e).value());
  }
  return out;
}

Status PosixVolume::DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                                bool recursive) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  // Every path is checked before anything is deleted; each is opened again to be deleted, so
  // that a batch holds two descriptors at a time, not one per path (a request of 200,000
  // paths would take the process's descriptors from every other request).
  std::vector<bool> rmdir;  // an empty directory: removed only while it is still empty
  for (const auto& rel : relpaths) {
    SLUICE_ASSIGN_OR_RETURN(ParentRef ref, OpenParentBeneath(root.get(), rel));
    struct stat sb;
    if (::fstatat(ref.dir.get(), ref.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0)
      return Status::FromErrno(errno, fmt::format("delete '{}'", rel));
    rmdir.push_back(S_ISDIR(sb.st_mode) && !recursive);
    if (S_ISDIR(sb.st_mode) && !recursive) {
      // Only an empty directory may go without recursive=true.
      SLUICE_ASSIGN_OR_RETURN(DirReader dir, DirReader::OpenAt(ref.dir.get(), ref.name, rel));
      SLUICE_ASSIGN_OR_RETURN(bool empty, dir.Empty());
      if (!empty)
        return Status(
            Code::kNotEmpty,
            fmt::format("directory '{}' is not empty; pass recursive=true to delete it", rel),
            ENOTEMPTY);
    }
  }
  for (size_t i = 0; i < relpaths.size(); ++i) {
    // A path named twice, or below another path of the batch, may be gone by now: gone is
    // what was asked (before, the batch failed after deleting).
    auto opened = OpenParentBeneath(root.get(), relpaths[i]);
    if (!opened.ok() && opened.status().code() == Code::kNotFound) continue;
    SLUICE_ASSIGN_OR_RETURN(ParentRef t, std::move(opened));
    if (rmdir[i]) {
      // Something may have been created in it since the check: rmdir fails then, atomically.
      if (::unlinkat(t.dir.get(), t.name.c_str(), AT_REMOVEDIR) != 0) {
        if (errno == ENOENT) continue;
        if (errno == ENOTEMPTY || errno == EEXIST)
          return Status(Code::kNotEmpty,
                        fmt::format("directory '{}' is not empty; pass recursive=true to delete it",
                                    relpaths[i]),
                        ENOTEMPTY);
        return Status::FromErrno(errno, fmt::format("delete '{}'", relpaths[i]));
      }
      AccountWrite(vfid, 0, -1);
      continue;
    }
    if (!recursive) {
      // A file when checked: unlinked as one, so that a directory put in its place since
      // fails (EISDIR) instead of going whole, as recursive=false promised.
      struct stat sb;
      const bool seen = ::fstatat(t.dir.get(), t.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) == 0;
      if (::unlinkat(t.dir.get(), t.name.c_str(), 0) != 0) {
        if (errno == ENOENT) continue;  // gone already, as RemoveTreeAt takes it
        return Status::FromErrno(errno, fmt::format("delete '{}'", relpaths[i]));
      }
      AccountWrite(vfid, seen && !S_ISDIR(sb.st_mode) ? -static_cast<int64_t>(sb.st_size) : 0, -1);
      continue;
    }
    TreeCount removed;
    Status st = RemoveTreeAt(t.dir.get(), t.name, &removed);
    AccountWrite(vfid, -static_cast<int64_t>(removed.bytes),
                 -static_cast<int64_t>(removed.entries));
    SLUICE_RETURN_IF_ERROR(st);
  }
  return Status::Ok();
}

Status PosixVolume::CloneVFolderInto(const VFolderId& src, const VFolderId& dst) {
  return fsop().CopyTree(VFolderPath(src), VFolderPath(dst));
}

namespace {

// The tree of `d` (another kind of volume's: an s3 one) written into directory `to`: directories
// made, files written from their readers with their mtime and object metadata, symbolic links
// and special files left out (counted in `*skipped`). Bytes and entries written are counted.
Status CopyTreeIn(DirHandle& d, int to, bool root, std::vector<char>& buf, uint64_t* bytes,
                  uint64_t* entries, uint64_t* skipped) {
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto n, d.Next());
    if (!n) return Status::Ok();
    if (root && n->name == kStagingDirName) continue;
    SLUICE_RETURN_IF_ERROR(ValidateName(n->name));  // whatever the other volume lists
    const char* name = n->name.c_str();
    if (n->type == EntryType::kDirectory) {
      if (::mkdirat(to, name, 0755) != 0 && errno != EEXIST)
        return Status::FromErrno(errno, fmt::format("make directory '{}'", n->name));
      UniqueFd sub(::openat(to, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.get() < 0) return Status::FromErrno(errno, fmt::format("open '{}'", n->name));
      SLUICE_ASSIGN_OR_RETURN(auto from, d.OpenSubdir(n->name));
      *entries += 1;
      SLUICE_RETURN_IF_ERROR(CopyTreeIn(*from, sub.get(), false, buf, bytes, entries, skipped));
      continue;
    }
    if (n->type != EntryType::kFile) {
      *skipped += 1;
      continue;
    }
    SLUICE_ASSIGN_OR_RETURN(auto r, d.OpenFile(n->name));
    UniqueFd out(::openat(to, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (out.get() < 0) return Status::FromErrno(errno, fmt::format("create '{}'", n->name));
    for (uint64_t off = 0; off < r->size();) {
      SLUICE_ASSIGN_OR_RETURN(size_t k, r->ReadAt(off, buf.data(), buf.size()));
      if (k == 0)
        return Status(Code::kConflict, fmt::format("'{}' shrank while being copied", n->name));
      for (size_t w = 0; w < k;) {
        ssize_t m = ::write(out.get(), buf.data() + w, k - w);
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0) return Status::FromErrno(errno, fmt::format("write '{}'", n->name));
        w += static_cast<size_t>(m);
      }
      off += k;
    }
    // Its object metadata where the file system keeps user xattrs (lost, as on every write
    // there, where it does not), then the mtime that metadata was stored against.
    if (auto meta = r->ReadMeta(); meta.ok() && !meta->empty())
      (void)WriteObjectMeta(out.get(), *meta);
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(r->info().modified.time_since_epoch())
            .count();
    const timespec times[2] = {{0, UTIME_OMIT}, {ns / 1000000000, ns % 1000000000}};
    ::futimens(out.get(), times);
    *bytes += r->size();
    *entries += 1;
  }
}

}  // namespace

Status PosixVolume::CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                    const TreeUsage& size) {
  auto* other = dynamic_cast<PosixVolume*>(&ForwardingVolume::Innermost(from));
  if (!other) {
    // Another kind of volume (an s3 one): its files read and written here.
    SLUICE_ASSIGN_OR_RETURN(auto tree, from.OpenDir(src, ""));
    SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(dst));
    UniqueFd dir(::openat(root.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() < 0) return Status::FromErrno(errno, "open the new vfolder");
    std::vector<char> buf(1 << 20);
    uint64_t bytes = 0, entries = 0, skipped = 0;
    Status st = CopyTreeIn(*tree, dir.get(), true, buf, &bytes, &entries, &skipped);
    AccountWrite(dst, static_cast<int64_t>(bytes), static_cast<int64_t>(entries));
    if (skipped)
      spdlog::warn(
          "volume {}: copying {} from {}: {} entries neither files nor directories "
          "left out",
          name(), src.ToString(), from.name(), skipped);
    return st;
  }
  Status st = other == this ? CloneVFolderInto(src, dst)
                            : fsop().CopyTree(other->VFolderPath(src), VFolderPath(dst));
  // The source's uploads in progress are its own: a copy of them in the clone would count
  // against its quota and be swept later (a snapshot or a tree copy takes them along).
  TreeCount staged;
  if (st.ok()) {
    SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(dst));
    st = RemoveTreeAt(root.get(), kStagingDirName, &staged);
  }
  if (st.ok())
    AccountWrite(dst, static_cast<int64_t>(size.used_bytes) - static_cast<int64_t>(staged.bytes),
                 static_cast<int64_t>(size.file_count) - static_cast<int64_t>(staged.entries));
  return st;
}

// ----------------------------------------------------------------------------------- staging

Result<std::string> PosixVolume::CreateStaging(const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  return CreateStagingAt(root.get(),
                         [this, vfid](int64_t b, int64_t e) { AccountWrite(vfid, b, e); });
}

Status PosixVolume::DiscardStaging(const VFolderId& vfid, const std::string& session) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  return DiscardStagingAt(root.get(), session,
                          [this, vfid](int64_t b, int64_t e) { AccountWrite(vfid, b, e); });
}

Result<StagingState> PosixVolume::InspectStaging(const VFolderId& vfid,
                                                 const std::string& session) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  return InspectStagingAt(root.get(), session);
}

Result<std::unique_ptr<StagingWriter>> PosixVolume::OpenStaging(const VFolderId& vfid,
                                                                const std::string& session,
                                                                std::chrono::milliseconds wait) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolderRoot(vfid));
  return OpenStagingAt(std::move(root), session, wait,
                       [this, vfid](int64_t b, int64_t e) { AccountWrite(vfid, b, e); });
}

namespace {

// Calls `fn(fd, name)` for each subdirectory of `dirfd` whose name is `n` lower-case hex digits.
template <typename Fn>
void ForEachHexSubdir(int dirfd, size_t n, Fn fn) {
  auto entries = ReadDirEntries(dirfd, ".");
  if (!entries.ok()) return;
  for (const auto& e : *entries) {
    if (!IsLowerHex(e.name, n, n)) continue;
    int fd = ::openat(dirfd, e.name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    UniqueFd f(fd);
    fn(f.get(), e.name);
  }
}

}  // namespace

void PosixVolume::ForEachVFolder(const std::function<void(int vfdir, const std::string& scope_hex,
                                                          const std::string& vf_hex)>& fn) const {
  int mfd = ::open(cfg_.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (mfd < 0) return;
  UniqueFd mount(mfd);
  // <ab>/<cd>/<rest> below `base`: the one place besides VFolderPath that knows the layout.
  auto walk_hash = [&](int base, const std::string& scope) {
    ForEachHexSubdir(base, 2, [&](int ab, const std::string& abn) {
      ForEachHexSubdir(ab, 2, [&](int cd, const std::string& cdn) {
        ForEachHexSubdir(cd, 28,
                         [&](int vf, const std::string& rest) { fn(vf, scope, abn + cdn + rest); });
      });
    });
  };
  walk_hash(mount.get(), "");  // legacy (v2) vfolders
  ForEachHexSubdir(mount.get(), 32,
                   [&](int scope, const std::string& sn) { walk_hash(scope, sn); });
}

StagingSweep PosixVolume::SweepStaging(const std::optional<VFolderId>& vfid,
                                       std::chrono::seconds age, const StagingRemoved& removed) {
  StagingSweep total;
  auto one = [&](int vfdir, const std::string& scope_hex, const std::string& vf_hex,
                 const VFolderId& id) {
    std::string where =
        fmt::format("{}/{}{}", cfg_.path, scope_hex.empty() ? "" : scope_hex + "/", vf_hex);
    StagingSweep st = SweepStagingAt(
        vfdir, where, age,
        [&](const std::string& session) {
          if (removed) removed(scope_hex, vf_hex, session);
        },
        [&](int64_t b, int64_t e) { AccountWrite(id, b, e); });
    total.removed += st.removed;
    total.removed_bytes += st.removed_bytes;
    total.kept_locked += st.kept_locked;
  };
  if (vfid) {
    auto root = OpenVFolderRoot(*vfid);
    if (root.ok()) one(root->get(), vfid->scope ? vfid->scope->hex : "", vfid->hex, *vfid);
    return total;
  }
  ForEachVFolder([&](int vfdir, const std::string& scope_hex, const std::string& vf_hex) {
    // The layout names the scope by its hex alone: enough for accounting, which goes by path
    // (VFolderPath); the scope's type is not known here and not needed.
    VFolderId id{std::nullopt, vf_hex};
    if (!scope_hex.empty()) id.scope = QuotaScopeId{QuotaScopeType::kUser, scope_hex};
    one(vfdir, scope_hex, vf_hex, id);
  });
  return total;
}

}  // namespace sluice
