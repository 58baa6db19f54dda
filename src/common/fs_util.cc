#include "common/fs_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace sluice {

Status WriteFileAtomic(const std::string& path, std::string_view body, mode_t mode) {
  // A temporary name of its own (two writers of one file, a manager's retry say, must not
  // write into one temporary file), then the rename and the directory made durable.
  static std::atomic<uint64_t> seq{0};
  std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), seq.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("write '{}'", tmp));
  bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
            ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::FromErrno(err, fmt::format("write '{}'", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno(err, fmt::format("rename '{}'", tmp));
  }
  size_t slash = path.rfind('/');
  // Best effort: the new content is in place either way (some FUSE file systems refuse it).
  (void)SyncDir(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
  return Status::Ok();
}

Status SyncDir(const std::string& path) {
  int dfd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Status::FromErrno(errno, fmt::format("open directory '{}'", path));
  const bool ok = ::fsync(dfd) == 0;
  const int err = errno;
  ::close(dfd);
  if (!ok) return Status::FromErrno(err, fmt::format("fsync of directory '{}'", path));
  return Status::Ok();
}

Status EnsureDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0 || errno == EEXIST) return Status::Ok();
  return Status::FromErrno(errno, fmt::format("mkdir '{}'", path));
}

int RenameNoReplace(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  if (::renameat2(olddirfd, oldpath, newdirfd, newpath, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) return -1;
  // EINVAL is also the answer to renaming a directory into itself: only fall back when the
  // source exists and the target does not.
  struct stat sb;
  if (::fstatat(olddirfd, oldpath, &sb, AT_SYMLINK_NOFOLLOW) != 0) return -1;
  if (S_ISREG(sb.st_mode)) {
    if (::linkat(olddirfd, oldpath, newdirfd, newpath, 0) != 0) return -1;
    if (::unlinkat(olddirfd, oldpath, 0) != 0) {
      // Not moved (the file under both names would count twice): the new name goes again.
      const int err = errno;
      ::unlinkat(newdirfd, newpath, 0);
      errno = err;
      return -1;
    }
    return 0;
  }
  if (::fstatat(newdirfd, newpath, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
    errno = EEXIST;
    return -1;
  }
  if (errno != ENOENT) return -1;
  return ::renameat(olddirfd, oldpath, newdirfd, newpath);
}

}  // namespace sluice
