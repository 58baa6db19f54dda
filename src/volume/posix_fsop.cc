#include "volume/posix_fsop.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "common/fd.h"
#include "common/fs_util.h"

namespace sluice {

namespace {

// Runs `fn` on the pool, or inline when the pool refuses (full queue), counting it in `wg`.
template <typename Fn>
void Spawn(ThreadPool* pool, WaitGroup& wg, Fn fn) {
  wg.Add();
  auto task = [fn = std::move(fn), &wg]() mutable {
    fn();
    wg.Done();
  };
  if (!pool || !pool->Submit(task)) task();
}

// Reads every entry of a directory fd (the fd is consumed by fdopendir).
struct Entry {
  std::string name;
  unsigned char d_type;
};
Result<std::vector<Entry>> ReadDirEntries(int dirfd, const std::string& what) {
  int fd = ::dup(dirfd);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("dup '{}'", what));
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, fmt::format("opendir '{}'", what));
  }
  ::rewinddir(d);
  std::vector<Entry> out;
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0)))
      continue;
    out.push_back({e->d_name, e->d_type});
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return Status::FromErrno(err, fmt::format("readdir '{}'", what));
  return out;
}

struct FirstError {
  std::mutex mu;
  std::atomic<bool> failed{false};
  Status status;
  void Set(Status s) {
    std::lock_guard lk(mu);
    if (!failed.exchange(true)) status = std::move(s);
  }
};

struct ScanState {
  ThreadPool* pool;
  WaitGroup wg;
  std::atomic<uint64_t> files{0}, bytes{0};
  FirstError err;
};

void ScanDir(ScanState* st, std::string path) {
  if (st->err.failed.load(std::memory_order_relaxed)) return;
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    // A directory removed while we walk is not an error for a usage figure.
    if (errno != ENOENT) st->err.Set(Status::FromErrno(errno, fmt::format("open '{}'", path)));
    return;
  }
  UniqueFd dirfd(fd);
  auto entries = ReadDirEntries(dirfd.get(), path);
  if (!entries.ok()) {
    st->err.Set(entries.status());
    return;
  }
  uint64_t files = 0, bytes = 0;
  for (auto& e : *entries) {
    ++files;
    bool is_dir = e.d_type == DT_DIR;
    if (e.d_type == DT_UNKNOWN || !is_dir) {
      struct stat sb;
      if (::fstatat(dirfd.get(), e.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) {
          --files;
          continue;
        }
        st->err.Set(Status::FromErrno(errno, fmt::format("stat '{}/{}'", path, e.name)));
        return;
      }
      is_dir = S_ISDIR(sb.st_mode);
      if (!is_dir) bytes += static_cast<uint64_t>(sb.st_size);
    }
    if (is_dir) Spawn(st->pool, st->wg, [st, p = path + "/" + e.name] { ScanDir(st, p); });
  }
  st->files.fetch_add(files, std::memory_order_relaxed);
  st->bytes.fetch_add(bytes, std::memory_order_relaxed);
}

struct CopyState {
  ThreadPool* pool;
  WaitGroup wg;
  FirstError err;
  std::mutex mu;
  std::vector<std::pair<std::string, struct stat>> dirs;  // modes/times to restore at the end
};

Status CopyOneFile(int sdir, int ddir, const std::string& name, const struct stat& sb,
                   const std::string& where) {
  int sfd = ::openat(sdir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (sfd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", where));
  UniqueFd src(sfd);
  int dfd =
      ::openat(ddir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, sb.st_mode & 07777);
  if (dfd < 0) return Status::FromErrno(errno, fmt::format("create copy of '{}'", where));
  UniqueFd dst(dfd);
  SLUICE_RETURN_IF_ERROR(CopyFileContents(src.get(), dst.get(), static_cast<uint64_t>(sb.st_size))
                             .WithContext(fmt::format("copy '{}'", where)));
  ::fchmod(dst.get(), sb.st_mode & 07777);
  struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
  ::futimens(dst.get(), ts);
  return Status::Ok();
}

void CopyDir(CopyState* st, std::string src, std::string dst) {
  if (st->err.failed.load(std::memory_order_relaxed)) return;
  int sfd = ::open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (sfd < 0) return st->err.Set(Status::FromErrno(errno, fmt::format("open '{}'", src)));
  UniqueFd sdir(sfd);
  int dfd = ::open(dst.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (dfd < 0) return st->err.Set(Status::FromErrno(errno, fmt::format("open '{}'", dst)));
  UniqueFd ddir(dfd);
  auto entries = ReadDirEntries(sdir.get(), src);
  if (!entries.ok()) return st->err.Set(entries.status());
  for (auto& e : *entries) {
    if (st->err.failed.load(std::memory_order_relaxed)) return;
    std::string where = src + "/" + e.name;
    struct stat sb;
    if (::fstatat(sdir.get(), e.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0)
      return st->err.Set(Status::FromErrno(errno, fmt::format("stat '{}'", where)));
    if (S_ISDIR(sb.st_mode)) {
      if (::mkdirat(ddir.get(), e.name.c_str(), 0700) != 0)
        return st->err.Set(Status::FromErrno(errno, fmt::format("mkdir copy of '{}'", where)));
      std::string sub = dst + "/" + e.name;
      {
        std::lock_guard lk(st->mu);
        st->dirs.emplace_back(sub, sb);
      }
      Spawn(st->pool, st->wg, [st, where, sub] { CopyDir(st, where, sub); });
    } else if (S_ISREG(sb.st_mode)) {
      Status s = CopyOneFile(sdir.get(), ddir.get(), e.name, sb, where);
      if (!s.ok()) return st->err.Set(std::move(s));
    } else if (S_ISLNK(sb.st_mode)) {
      std::string target(static_cast<size_t>(sb.st_size > 0 ? sb.st_size : PATH_MAX), '\0');
      ssize_t n = ::readlinkat(sdir.get(), e.name.c_str(), target.data(), target.size());
      if (n < 0) return st->err.Set(Status::FromErrno(errno, fmt::format("readlink '{}'", where)));
      target.resize(static_cast<size_t>(n));
      if (::symlinkat(target.c_str(), ddir.get(), e.name.c_str()) != 0)
        return st->err.Set(Status::FromErrno(errno, fmt::format("symlink copy of '{}'", where)));
    }
    // Sockets, fifos and devices are not copied: they carry no data.
  }
}

}  // namespace

Status CopyFileContents(int src_fd, int dst_fd, uint64_t size) {
  if (size > 0 && ::ioctl(dst_fd, FICLONE, src_fd) == 0) return Status::Ok();
  uint64_t done = 0;
  bool use_cfr = true;
  while (done < size && use_cfr) {
    ssize_t n = ::copy_file_range(src_fd, nullptr, dst_fd, nullptr, size - done, 0);
    if (n > 0) {
      done += static_cast<uint64_t>(n);
    } else if (n == 0) {
      break;  // the source shrank
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
      use_cfr = false;
    } else {
      return Status::FromErrno(errno, "copy_file_range");
    }
  }
  if (done >= size) return Status::Ok();
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::pread(src_fd, buf.data(), buf.size(), static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read");
    }
    if (n == 0) break;
    ssize_t off = 0;
    while (off < n) {
      ssize_t w = ::pwrite(dst_fd, buf.data() + off, static_cast<size_t>(n - off),
                           static_cast<off_t>(done + static_cast<uint64_t>(off)));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "write");
      }
      off += w;
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status RemoveTreeAt(int dirfd, const std::string& name, TreeUsage* removed) {
  struct stat sb;
  bool counted = removed && ::fstatat(dirfd, name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) == 0;
  if (::unlinkat(dirfd, name.c_str(), 0) == 0) {
    if (counted) {
      removed->file_count += 1;
      removed->used_bytes += static_cast<uint64_t>(sb.st_size);
    }
    return Status::Ok();
  }
  if (errno == ENOENT) return Status::Ok();
  if (errno != EISDIR && errno != EPERM)
    return Status::FromErrno(errno, fmt::format("unlink '{}'", name));
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", name));
  UniqueFd sub(fd);
  // Re-read until empty: entries created concurrently are removed too.
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(sub.get(), name));
    if (entries.empty()) break;
    for (auto& e : entries) SLUICE_RETURN_IF_ERROR(RemoveTreeAt(sub.get(), e.name, removed));
  }
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    return Status::FromErrno(errno, fmt::format("rmdir '{}'", name));
  if (removed) removed->file_count += 1;
  return Status::Ok();
}

Result<TreeUsage> PosixFSOpModel::ScanTree(const std::string& path) {
  struct stat sb;
  if (::lstat(path.c_str(), &sb) != 0)
    return Status::FromErrno(errno, fmt::format("stat '{}'", path));
  if (!S_ISDIR(sb.st_mode)) return TreeUsage{1, static_cast<uint64_t>(sb.st_size)};
  auto st = std::make_unique<ScanState>();
  st->pool = pool_;
  ScanState* raw = st.get();
  Spawn(pool_, st->wg, [raw, path] { ScanDir(raw, path); });
  st->wg.Wait();
  if (st->err.failed) return st->err.status;
  return TreeUsage{st->files.load(), st->bytes.load()};
}

Status PosixFSOpModel::CopyTree(const std::string& src, const std::string& dst) {
  struct stat sb;
  if (::stat(src.c_str(), &sb) != 0) return Status::FromErrno(errno, fmt::format("stat '{}'", src));
  if (!S_ISDIR(sb.st_mode))
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", src));
  if (::mkdir(dst.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::FromErrno(errno, fmt::format("mkdir '{}'", dst));
  auto st = std::make_unique<CopyState>();
  st->pool = pool_;
  st->dirs.emplace_back(dst, sb);
  CopyState* raw = st.get();
  Spawn(pool_, st->wg, [raw, src, dst] { CopyDir(raw, src, dst); });
  st->wg.Wait();
  if (st->err.failed) return st->err.status;
  // Directory modes and times last: copying into a read-only directory must still work.
  for (auto it = st->dirs.rbegin(); it != st->dirs.rend(); ++it) {
    ::chmod(it->first.c_str(), it->second.st_mode & 07777);
    struct timespec ts[2] = {it->second.st_atim, it->second.st_mtim};
    ::utimensat(AT_FDCWD, it->first.c_str(), ts, AT_SYMLINK_NOFOLLOW);
  }
  return Status::Ok();
}

Status PosixFSOpModel::MoveTree(const std::string& src, const std::string& dst) {
  if (RenameNoReplace(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str()) == 0) return Status::Ok();
  if (errno != EXDEV) return Status::FromErrno(errno, fmt::format("rename '{}' -> '{}'", src, dst));
  SLUICE_RETURN_IF_ERROR(CopyTree(src, dst));
  return DeleteTree(src);
}

Result<PathParent> OpenPathParent(const std::string& path, int flags) {
  std::string parent = ".";
  PathParent out;
  out.name = path;
  size_t slash = path.rfind('/');
  if (slash != std::string::npos) {
    parent = slash == 0 ? "/" : path.substr(0, slash);
    out.name = path.substr(slash + 1);
  }
  int fd = ::open(parent.c_str(), flags | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return out;
    return Status::FromErrno(errno, fmt::format("open '{}'", parent));
  }
  out.dir.reset(fd);
  return out;
}

Status PosixFSOpModel::DeleteTree(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(PathParent p, OpenPathParent(path, O_PATH));
  if (!p.dir.valid()) return Status::Ok();  // already gone
  return RemoveTreeAt(p.dir.get(), p.name);
}

}  // namespace sluice
