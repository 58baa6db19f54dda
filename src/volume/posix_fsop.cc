#include "volume/posix_fsop.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "common/dir_reader.h"
#include "common/fs_util.h"

namespace sluice {

namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

struct FirstError {
  std::mutex mu;
  std::atomic<bool> failed{false};
  Status status;
  void Set(Status s) {
    std::lock_guard lk(mu);
    if (!failed.exchange(true)) status = std::move(s);
  }
};

// Runs `fn` for every subdirectory of the open directory `root` on the pool (inline when the
// pool refuses), `leaf` for every other entry inline; waits for all. Trees are usually wide at
// the top, so one job per top-level subtree keeps the pool busy while each job walks its
// subtree with a bounded number of descriptors.
template <typename SubtreeFn, typename LeafFn>
Status ForEachSubtree(ThreadPool* pool, int root, SubtreeFn fn, LeafFn leaf) {
  SLUICE_ASSIGN_OR_RETURN(auto entries, ReadDirEntries(root, "."));
  auto err = std::make_shared<FirstError>();
  WaitGroup wg;
  for (auto& e : entries) {
    if (err->failed.load(std::memory_order_relaxed)) break;
    struct stat sb;
    if (::fstatat(root, e.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // gone meanwhile
      // Not a return: jobs already submitted use `wg`, `root` and the caller's state.
      err->Set(Status::FromErrno(errno, fmt::format("stat '{}'", e.name)));
      break;
    }
    if (!S_ISDIR(sb.st_mode)) {
      Status s = leaf(e.name, sb);
      if (!s.ok()) err->Set(std::move(s));
      continue;
    }
    wg.Add();
    auto task = [fn, err, &wg, root, name = e.name, sb]() mutable {
      if (!err->failed.load(std::memory_order_relaxed)) {
        Status s = fn(root, name, sb);
        if (!s.ok()) err->Set(std::move(s));
      }
      wg.Done();
    };
    if (!pool || !pool->Submit(task)) task();
  }
  wg.Wait();
  if (err->failed) return err->status;
  return Status::Ok();
}

}  // namespace

Result<TreeCount> PosixFSOpModel::ScanTreeAt(int root) {
  std::atomic<uint64_t> entries{0}, bytes{0};
  Status st = ForEachSubtree(
      pool_, root,
      [&](int parent, const std::string& name, const struct stat&) -> Status {
        int fd = ::openat(parent, name.c_str(), kDirFlags);
        if (fd < 0) {
          if (errno == ENOENT) return Status::Ok();  // a usage figure tolerates a vanished dir
          return Status::FromErrno(errno, fmt::format("open '{}'", name));
        }
        UniqueFd sub(fd);
        SLUICE_ASSIGN_OR_RETURN(TreeCount c, CountTree(sub.get()));
        entries.fetch_add(c.entries + 1, std::memory_order_relaxed);
        bytes.fetch_add(c.bytes, std::memory_order_relaxed);
        return Status::Ok();
      },
      [&](const std::string&, const struct stat& sb) -> Status {
        entries.fetch_add(1, std::memory_order_relaxed);
        bytes.fetch_add(static_cast<uint64_t>(sb.st_size), std::memory_order_relaxed);
        return Status::Ok();
      });
  SLUICE_RETURN_IF_ERROR(st);
  return TreeCount{entries.load(), bytes.load()};
}

Result<TreeUsage> PosixFSOpModel::ScanTree(const std::string& path) {
  int fd = ::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("stat '{}'", path));
  UniqueFd root(fd);
  struct stat sb;
  if (::fstat(root.get(), &sb) != 0)
    return Status::FromErrno(errno, fmt::format("stat '{}'", path));
  if (!S_ISDIR(sb.st_mode)) return TreeUsage{1, static_cast<uint64_t>(sb.st_size)};
  SLUICE_ASSIGN_OR_RETURN(TreeCount c, ScanTreeAt(root.get()));
  return TreeUsage{c.entries, c.bytes};
}

Status PosixFSOpModel::CopyTreeAt(int src, int dst) {
  return ForEachSubtree(
      pool_, src,
      [dst](int parent, const std::string& name, const struct stat& sb) -> Status {
        if (::mkdirat(dst, name.c_str(), 0700) != 0)
          return Status::FromErrno(errno, fmt::format("mkdir copy of '{}'", name));
        int sfd = ::openat(parent, name.c_str(), kDirFlags);
        if (sfd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", name));
        UniqueFd s(sfd);
        int dfd = ::openat(dst, name.c_str(), kDirFlags);
        if (dfd < 0) return Status::FromErrno(errno, fmt::format("open copy of '{}'", name));
        UniqueFd d(dfd);
        SLUICE_RETURN_IF_ERROR(CopyTreeInto(s.get(), d.get()));
        // Modes and times last: copying into a read-only directory must still work.
        CopyOwnerAndMode(d.get(), sb);
        struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
        ::futimens(d.get(), ts);
        return Status::Ok();
      },
      [src, dst](const std::string& name, const struct stat& sb) -> Status {
        if (S_ISREG(sb.st_mode)) return CopyOneFile(src, dst, name);
        if (S_ISLNK(sb.st_mode)) return CopySymlink(src, dst, name, sb);
        return Status::Ok();  // sockets, fifos and devices carry no data
      });
}

Status PosixFSOpModel::CopyTree(const std::string& src, const std::string& dst) {
  int sfd = ::open(src.c_str(), kDirFlags);
  if (sfd < 0) {
    if (errno == ENOTDIR)
      return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", src));
    return Status::FromErrno(errno, fmt::format("open '{}'", src));
  }
  UniqueFd s(sfd);
  struct stat sb;
  if (::fstat(s.get(), &sb) != 0) return Status::FromErrno(errno, fmt::format("stat '{}'", src));
  if (::mkdir(dst.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::FromErrno(errno, fmt::format("mkdir '{}'", dst));
  int dfd = ::open(dst.c_str(), kDirFlags);
  if (dfd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", dst));
  UniqueFd d(dfd);
  SLUICE_RETURN_IF_ERROR(CopyTreeAt(s.get(), d.get()));
  CopyOwnerAndMode(d.get(), sb);
  struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
  ::futimens(d.get(), ts);
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
