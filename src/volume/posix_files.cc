#include "volume/posix_files.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <climits>

#include <fmt/format.h>

#include "common/clock.h"

namespace sluice {

namespace {

std::chrono::system_clock::time_point ToTimePoint(const struct statx_timestamp& ts) {
  return UnixTime(ts.tv_sec, ts.tv_nsec);
}

EntryType TypeOf(mode_t m) {
  if (S_ISREG(m)) return EntryType::kFile;
  if (S_ISDIR(m)) return EntryType::kDirectory;
  if (S_ISLNK(m)) return EntryType::kSymlink;
  return EntryType::kOther;
}

EntryType TypeOfDirent(unsigned char t) {
  switch (t) {
    case DT_REG:
      return EntryType::kFile;
    case DT_DIR:
      return EntryType::kDirectory;
    case DT_LNK:
      return EntryType::kSymlink;
    default:
      return EntryType::kOther;
  }
}

}  // namespace

Result<DirEntry> StatAt(int dirfd, const std::string& name, bool dont_sync, bool birth_time) {
  struct statx sx;
  int flags = AT_SYMLINK_NOFOLLOW | (name.empty() ? AT_EMPTY_PATH : 0) |
              (dont_sync ? AT_STATX_DONT_SYNC : 0);
  unsigned mask = STATX_BASIC_STATS | (birth_time ? STATX_BTIME : 0);
  if (::statx(dirfd, name.c_str(), flags, mask, &sx) != 0)
    return Status::FromErrno(errno, fmt::format("stat '{}'", name.empty() ? "." : name));
  DirEntry e;
  e.name = name;
  e.type = TypeOf(sx.stx_mode);
  e.mode = sx.stx_mode;
  e.size = sx.stx_size;
  e.ino = sx.stx_ino;
  e.dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  e.modified = ToTimePoint(sx.stx_mtime);
  e.changed = ToTimePoint(sx.stx_ctime);
  e.created = (sx.stx_mask & STATX_BTIME) ? ToTimePoint(sx.stx_btime) : ToTimePoint(sx.stx_ctime);
  if (e.type == EntryType::kSymlink && !name.empty()) {
    std::string target(PATH_MAX, '\0');
    ssize_t len = ::readlinkat(dirfd, name.c_str(), target.data(), target.size());
    if (len >= 0) {
      target.resize(static_cast<size_t>(len));
      e.symlink_target = std::move(target);
    }
  }
  return e;
}

namespace {

// getxattrat(2) (Linux 6.13): an attribute of a directory's entry, one lookup, never followed.
// The same number on every architecture (the unified table); -1 with ENOSYS on older kernels.
#ifndef __NR_getxattrat
#define __NR_getxattrat 464
#endif
struct XattrArgs {
  uint64_t value;
  uint32_t size;
  uint32_t flags;
};
std::atomic<bool> no_getxattrat{false};

ssize_t GetXattrAt(int dirfd, const std::string& name, const char* attr, char* buf, size_t cap) {
  if (!no_getxattrat.load(std::memory_order_relaxed)) {
    XattrArgs args{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(cap), 0};
    long n = ::syscall(__NR_getxattrat, dirfd, name.c_str(), AT_SYMLINK_NOFOLLOW, attr, &args,
                       sizeof args);
    // ENOSYS: an older kernel; EPERM: a seccomp filter that refuses syscalls it does not know
    // (reading a user.* attribute is never refused that way otherwise).
    if (n >= 0 || (errno != ENOSYS && errno != EPERM)) return n;
    no_getxattrat.store(true, std::memory_order_relaxed);
  }
  // Before it: the entry named through the directory's descriptor, a walk of /proc each time.
  std::string p = fmt::format("/proc/self/fd/{}/{}", dirfd, name);
  return ::lgetxattr(p.c_str(), attr, buf, cap);
}

}  // namespace

Result<std::string> ReadObjectMeta(int fd, const std::string& name) {
  // On the stack: this runs for every object read and listed. Asked for with a small buffer
  // first: the kernel allocates as much as it is offered (16 KiB is a large allocation, a few
  // pages each time), and most metadata is a hundred bytes.
  char buf[kMaxObjectMeta];
  auto get = [&](size_t cap) {
    return name.empty() ? ::fgetxattr(fd, kObjectMetaAttr, buf, cap)
                        : GetXattrAt(fd, name, kObjectMetaAttr, buf, cap);
  };
  ssize_t n = get(1024);
  if (n < 0 && errno == ERANGE) n = get(sizeof buf);
  if (n < 0) {
    if (errno == ENODATA || errno == ENOTSUP || errno == EOPNOTSUPP || errno == ERANGE)
      return std::string();
    return Status::FromErrno(errno, fmt::format("read metadata of '{}'", name));
  }
  return std::string(buf, static_cast<size_t>(n));
}

Status WriteObjectMeta(int fd, std::string_view meta) {
  if (::fsetxattr(fd, kObjectMetaAttr, meta.data(), meta.size(), 0) == 0) return Status::Ok();
  if (errno == ENOTSUP || errno == EOPNOTSUPP)
    return Status(Code::kUnsupported, "the file system keeps no user extended attributes", errno);
  return Status::FromErrno(errno, "store object metadata");
}

Result<std::string> PosixFileReader::ReadMeta() {
  return ReadObjectMeta(fd_.get(), "");
}

Result<std::string> PosixDirHandle::EntryMeta(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    return Status(Code::kInvalidPath, "not an entry name");
  return ReadObjectMeta(fd(), name);
}

Result<size_t> PosixFileReader::ReadAt(uint64_t offset, char* buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd_.get(), buf + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Status::FromErrno(errno, "read");
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

Result<size_t> PosixFileReader::ReadAtNoWait(uint64_t offset, char* buf, size_t n) {
  struct iovec iov {
    buf, n
  };
  for (;;) {
    ssize_t got = ::preadv2(fd_.get(), &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EOPNOTSUPP)
      return Status(Code::kUnavailable, "not in the page cache", EAGAIN);
    return Status::FromErrno(errno, "read");
  }
}

Result<std::shared_ptr<FileReader>> PosixFileReader::FromFd(UniqueFd fd, std::string_view shown,
                                                            bool dont_sync) {
  SLUICE_ASSIGN_OR_RETURN(DirEntry info, StatAt(fd.get(), "", dont_sync, false));
  if (info.type != EntryType::kFile)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a regular file", shown),
                  info.type == EntryType::kDirectory ? EISDIR : EINVAL);
  return std::shared_ptr<FileReader>(
      std::make_shared<PosixFileReader>(std::move(fd), std::move(info)));
}

Result<std::unique_ptr<DirHandle>> PosixDirHandle::FromFd(UniqueFd fd, std::string_view shown) {
  SLUICE_ASSIGN_OR_RETURN(DirReader reader, DirReader::Open(fd.get(), shown));
  fd.reset();
  SLUICE_ASSIGN_OR_RETURN(DirEntry info, StatAt(reader.fd(), ""));
  return std::unique_ptr<DirHandle>(new PosixDirHandle(std::move(reader), std::move(info)));
}

Result<std::optional<DirHandle::Name>> PosixDirHandle::Next() {
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto e, reader_.Next());
    if (!e) return std::optional<Name>();
    Name n{std::string(e->name), TypeOfDirent(e->type)};
    if (e->type == DT_UNKNOWN) {
      auto st = StatAt(fd(), n.name);
      if (!st.ok()) {
        if (st.status().code() == Code::kNotFound) continue;  // gone meanwhile
        return st.status();
      }
      n.type = st->type;
    }
    return std::optional<Name>(std::move(n));
  }
}

Result<DirEntry> PosixDirHandle::StatEntry(const std::string& name) {
  return StatAt(fd(), name);
}

Result<std::shared_ptr<FileReader>> PosixDirHandle::OpenFile(const std::string& name) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused as not a file).
  int f = ::openat(fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f < 0) {
    if (errno == ELOOP)
      return Status(Code::kInvalidPath, fmt::format("'{}' is a symbolic link", name), ELOOP);
    return Status::FromErrno(errno, fmt::format("open '{}'", name));
  }
  return PosixFileReader::FromFd(UniqueFd(f), name);
}

Result<std::unique_ptr<DirHandle>> PosixDirHandle::OpenSubdir(const std::string& name) {
  int d = ::openat(fd(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0) {
    if (errno == ELOOP)
      return Status(Code::kInvalidPath, fmt::format("'{}' is a symbolic link", name), ELOOP);
    if (errno == ENOTDIR) {
      // O_DIRECTORY is checked before O_NOFOLLOW: a link says ENOTDIR, and is still a link.
      struct stat sb;
      if (::fstatat(fd(), name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode))
        return Status(Code::kInvalidPath, fmt::format("'{}' is a symbolic link", name), ELOOP);
      return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", name), ENOTDIR);
    }
    return Status::FromErrno(errno, fmt::format("open '{}'", name));
  }
  return FromFd(UniqueFd(d), name);
}

}  // namespace sluice
