#include "common/fs_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace sluice {

Status WriteFileAtomic(const std::string& path, std::string_view body, mode_t mode) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("write '{}'", tmp));
  bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
            ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) return Status::FromErrno(err, fmt::format("write '{}'", tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::FromErrno(errno, fmt::format("rename '{}'", tmp));
  return Status::Ok();
}

Status EnsureDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0 || errno == EEXIST) return Status::Ok();
  return Status::FromErrno(errno, fmt::format("mkdir '{}'", path));
}

int RenameNoReplace(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  if (::renameat2(olddirfd, oldpath, newdirfd, newpath, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL) return -1;
  // EINVAL is also the answer to renaming a directory into itself: only fall back when the
  // source exists and the target does not.
  struct stat sb;
  if (::fstatat(olddirfd, oldpath, &sb, AT_SYMLINK_NOFOLLOW) != 0) return -1;
  if (::fstatat(newdirfd, newpath, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
    errno = EEXIST;
    return -1;
  }
  if (errno != ENOENT) return -1;
  return ::renameat(olddirfd, oldpath, newdirfd, newpath);
}

}  // namespace sluice
