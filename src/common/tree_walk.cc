#include "common/tree_walk.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <climits>

#include <fmt/format.h>

namespace sluice {

namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

unsigned char TypeOfMode(mode_t m) {
  if (S_ISDIR(m)) return DT_DIR;
  if (S_ISREG(m)) return DT_REG;
  if (S_ISLNK(m)) return DT_LNK;
  if (S_ISFIFO(m)) return DT_FIFO;
  if (S_ISSOCK(m)) return DT_SOCK;
  if (S_ISCHR(m)) return DT_CHR;
  if (S_ISBLK(m)) return DT_BLK;
  return DT_UNKNOWN;
}

}  // namespace

Status DirStack::Push(UniqueFd dir) {
  struct stat sb;
  if (::fstat(dir.get(), &sb) != 0) return Status::FromErrno(errno, "stat a directory of a walk");
  levels_.push_back({std::move(dir), sb.st_dev, sb.st_ino});
  if (levels_.size() > max_open_) levels_[levels_.size() - 1 - max_open_].fd.reset();
  return Status::Ok();
}

Status DirStack::Pop() {
  Level gone = std::move(levels_.back());
  levels_.pop_back();
  if (levels_.empty() || levels_.back().fd.valid()) return Status::Ok();
  Level& up = levels_.back();
  int fd = ::openat(gone.fd.get(), "..", kDirFlags);
  if (fd < 0) return Status::FromErrno(errno, "re-open a directory of a walk through '..'");
  UniqueFd parent(fd);
  struct stat sb;
  if (::fstat(parent.get(), &sb) != 0)
    return Status::FromErrno(errno, "stat a directory of a walk");
  if (sb.st_dev != up.dev || sb.st_ino != up.ino)
    return Status(Code::kConflict,
                  "a directory was moved while the tree was walked; the walk stopped there", EBUSY);
  up.fd = std::move(parent);
  return Status::Ok();
}

Status WalkTree(int root, const TreeVisitor& v, size_t max_open) {
  struct Frame {
    std::vector<RawDirEntry> entries;
    size_t next = 0;
    std::string name;  // in the parent
  };
  int rfd = ::openat(root, ".", kDirFlags);
  if (rfd < 0) return Status::FromErrno(errno, "open the root of a walk");
  DirStack stack(max_open);
  SLUICE_RETURN_IF_ERROR(stack.Push(UniqueFd(rfd)));
  std::vector<Frame> frames;
  {
    SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(stack.top(), "."));
    frames.push_back({std::move(entries), 0, {}});
  }
  while (!frames.empty()) {
    Frame& f = frames.back();
    if (f.next == f.entries.size()) {
      std::string name = std::move(f.name);
      frames.pop_back();
      if (frames.empty()) break;
      SLUICE_RETURN_IF_ERROR(stack.Pop());
      if (v.leave) SLUICE_RETURN_IF_ERROR(v.leave(stack.top(), name, frames.size()));
      continue;
    }
    RawDirEntry& e = f.entries[f.next++];
    unsigned char type = e.type;
    if (type == DT_UNKNOWN) {
      struct stat sb;
      if (::fstatat(stack.top(), e.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // gone meanwhile
        return Status::FromErrno(errno, fmt::format("stat '{}'", e.name));
      }
      type = TypeOfMode(sb.st_mode);
    }
    const size_t depth = frames.size();
    WalkEntry we{stack.top(), e.name, type, depth};
    WalkAction act = WalkAction::kDescend;
    if (v.entry) {
      SLUICE_ASSIGN_OR_RETURN(act, v.entry(we));
    }
    if (act == WalkAction::kStop) return Status::Ok();
    if (type != DT_DIR || act != WalkAction::kDescend) continue;
    int fd = ::openat(stack.top(), e.name.c_str(), kDirFlags);
    if (fd < 0) {
      if (errno == ENOENT) continue;
      return Status::FromErrno(errno, fmt::format("open directory '{}'", e.name));
    }
    UniqueFd child(fd);
    SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(child.get(), e.name));
    std::string name = e.name;  // `e` lives in `frames`, which grows below
    if (v.enter) SLUICE_RETURN_IF_ERROR(v.enter(we, child.get()));
    SLUICE_RETURN_IF_ERROR(stack.Push(std::move(child)));
    frames.push_back({std::move(entries), 0, std::move(name)});
  }
  return Status::Ok();
}

Result<TreeCount> CountTree(int root, size_t max_open) {
  TreeCount c;
  TreeVisitor v;
  v.entry = [&c](const WalkEntry& e) -> Result<WalkAction> {
    ++c.entries;
    if (e.type != DT_DIR) {
      struct stat sb;
      if (::fstatat(e.dirfd, e.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) {
          --c.entries;  // removed while we walk: not an error for a usage figure
          return WalkAction::kSkip;
        }
        return Status::FromErrno(errno, fmt::format("stat '{}'", e.name));
      }
      c.bytes += static_cast<uint64_t>(sb.st_size);
    }
    return WalkAction::kDescend;
  };
  SLUICE_RETURN_IF_ERROR(WalkTree(root, v, max_open));
  return c;
}

Status RemoveTreeAt(int dirfd, const std::string& name, TreeCount* removed,
                    const DirRemover& remover) {
  TreeCount scratch;
  TreeCount& r = removed ? *removed : scratch;
  struct stat sb;
  if (::fstatat(dirfd, name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? Status::Ok()
                           : Status::FromErrno(errno, fmt::format("stat '{}'", name));
  if (!S_ISDIR(sb.st_mode)) {
    if (::unlinkat(dirfd, name.c_str(), 0) != 0)
      return errno == ENOENT ? Status::Ok()
                             : Status::FromErrno(errno, fmt::format("unlink '{}'", name));
    r.entries += 1;
    r.bytes += static_cast<uint64_t>(sb.st_size);
    return Status::Ok();
  }
  if (remover) {
    SLUICE_ASSIGN_OR_RETURN(bool gone, remover(dirfd, name));
    if (gone) return Status::Ok();
  }
  int fd = ::openat(dirfd, name.c_str(), kDirFlags);
  if (fd < 0)
    return errno == ENOENT ? Status::Ok()
                           : Status::FromErrno(errno, fmt::format("open '{}'", name));
  UniqueFd top(fd);
  TreeVisitor v;
  v.entry = [&r, &remover](const WalkEntry& e) -> Result<WalkAction> {
    if (e.type == DT_DIR) {
      if (remover) {
        SLUICE_ASSIGN_OR_RETURN(bool gone, remover(e.dirfd, e.name));
        if (gone) return WalkAction::kSkip;
      }
      return WalkAction::kDescend;  // emptied first, removed on leave
    }
    struct stat st;
    bool counted = ::fstatat(e.dirfd, e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (::unlinkat(e.dirfd, e.name.c_str(), 0) != 0) {
      if (errno == ENOENT) return WalkAction::kSkip;
      return Status::FromErrno(errno, fmt::format("unlink '{}'", e.name));
    }
    r.entries += 1;
    if (counted) r.bytes += static_cast<uint64_t>(st.st_size);
    return WalkAction::kSkip;
  };
  // A directory that is still not empty when left (entries created meanwhile) is retried by
  // the outer loop.
  v.leave = [&r](int parent, const std::string& n, size_t) -> Status {
    if (::unlinkat(parent, n.c_str(), AT_REMOVEDIR) == 0) {
      r.entries += 1;
    } else if (errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST) {
      return Status::FromErrno(errno, fmt::format("rmdir '{}'", n));
    }
    return Status::Ok();
  };
  for (int attempt = 0;; ++attempt) {
    SLUICE_RETURN_IF_ERROR(WalkTree(top.get(), v).WithContext(fmt::format("remove '{}'", name)));
    if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) == 0) {
      r.entries += 1;
      return Status::Ok();
    }
    if (errno == ENOENT) return Status::Ok();
    if ((errno != ENOTEMPTY && errno != EEXIST) || attempt >= 16)
      return Status::FromErrno(errno, fmt::format("rmdir '{}'", name));
  }
}

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

void CopyOwnerAndMode(int fd, const struct stat& sb) {
  mode_t mode = sb.st_mode & 07777;
  if (::fchown(fd, sb.st_uid, sb.st_gid) != 0) mode &= ~static_cast<mode_t>(S_ISUID | S_ISGID);
  ::fchmod(fd, mode);
}

void CopyOwnerAndModeAt(int dirfd, const std::string& name, const struct stat& sb) {
  mode_t mode = sb.st_mode & 07777;
  if (::fchownat(dirfd, name.c_str(), sb.st_uid, sb.st_gid, AT_SYMLINK_NOFOLLOW) != 0)
    mode &= ~static_cast<mode_t>(S_ISUID | S_ISGID);
  ::fchmodat(dirfd, name.c_str(), mode, 0);
}

Status CopyOneFile(int sdir, int ddir, const std::string& name) {
  int sfd = ::openat(sdir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (sfd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", name));
  UniqueFd src(sfd);
  struct stat now;
  if (::fstat(src.get(), &now) != 0 || !S_ISREG(now.st_mode))
    return Status(Code::kConflict, fmt::format("'{}' changed while being copied", name), EBUSY);
  // Private until the owner is set: a set-id mode goes on only where the owner could be kept.
  int dfd = ::openat(ddir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (dfd < 0) return Status::FromErrno(errno, fmt::format("create copy of '{}'", name));
  UniqueFd dst(dfd);
  SLUICE_RETURN_IF_ERROR(CopyFileContents(src.get(), dst.get(), static_cast<uint64_t>(now.st_size))
                             .WithContext(fmt::format("copy '{}'", name)));
  CopyOwnerAndMode(dst.get(), now);
  struct timespec ts[2] = {now.st_atim, now.st_mtim};
  ::futimens(dst.get(), ts);
  return Status::Ok();
}

Status CopySymlink(int sdir, int ddir, const std::string& name, const struct stat& sb) {
  std::string target(static_cast<size_t>(sb.st_size > 0 ? sb.st_size : PATH_MAX), '\0');
  ssize_t n = ::readlinkat(sdir, name.c_str(), target.data(), target.size());
  if (n < 0) return Status::FromErrno(errno, fmt::format("readlink '{}'", name));
  target.resize(static_cast<size_t>(n));
  if (::symlinkat(target.c_str(), ddir, name.c_str()) != 0)
    return Status::FromErrno(errno, fmt::format("symlink copy of '{}'", name));
  (void)::fchownat(ddir, name.c_str(), sb.st_uid, sb.st_gid, AT_SYMLINK_NOFOLLOW);
  return Status::Ok();
}

Status CopyTreeInto(int src, int dst, size_t max_open) {
  // The destination side of the walk: its own stack of descriptors, and the source
  // directories' attributes to set when each is left.
  int dfd = ::openat(dst, ".", kDirFlags);
  if (dfd < 0) return Status::FromErrno(errno, "open the copy's destination");
  DirStack dstack(max_open);
  SLUICE_RETURN_IF_ERROR(dstack.Push(UniqueFd(dfd)));
  std::vector<struct stat> dir_attrs;  // of the source directories entered, innermost last
  struct stat entering {};
  TreeVisitor v;
  v.entry = [&](const WalkEntry& e) -> Result<WalkAction> {
    struct stat sb;
    if (::fstatat(e.dirfd, e.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return WalkAction::kSkip;
      return Status::FromErrno(errno, fmt::format("stat '{}'", e.name));
    }
    if (S_ISDIR(sb.st_mode)) {
      if (::mkdirat(dstack.top(), e.name.c_str(), 0700) != 0)
        return Status::FromErrno(errno, fmt::format("mkdir copy of '{}'", e.name));
      entering = sb;
      return WalkAction::kDescend;
    }
    if (S_ISREG(sb.st_mode)) SLUICE_RETURN_IF_ERROR(CopyOneFile(e.dirfd, dstack.top(), e.name));
    if (S_ISLNK(sb.st_mode)) SLUICE_RETURN_IF_ERROR(CopySymlink(e.dirfd, dstack.top(), e.name, sb));
    return WalkAction::kSkip;
  };
  v.enter = [&](const WalkEntry& e, int) -> Status {
    int fd = ::openat(dstack.top(), e.name.c_str(), kDirFlags);
    if (fd < 0) return Status::FromErrno(errno, fmt::format("open copy of '{}'", e.name));
    dir_attrs.push_back(entering);
    return dstack.Push(UniqueFd(fd));
  };
  v.leave = [&](int, const std::string& name, size_t) -> Status {
    SLUICE_RETURN_IF_ERROR(dstack.Pop());
    // Modes and times last: copying into a read-only directory must still work.
    const struct stat& sb = dir_attrs.back();
    CopyOwnerAndModeAt(dstack.top(), name, sb);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    ::utimensat(dstack.top(), name.c_str(), ts, AT_SYMLINK_NOFOLLOW);
    dir_attrs.pop_back();
    return Status::Ok();
  };
  return WalkTree(src, v, max_open);
}

}  // namespace sluice
