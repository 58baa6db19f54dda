#include "common/path.h"

#include <limits.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>

namespace sluice {

namespace {
long SysOpenat2(int dirfd, const char* path, struct open_how* how) {
  return ::syscall(SYS_openat2, dirfd, path, how, sizeof(*how));
}
}  // namespace

Status ValidateName(std::string_view name) {
  if (name.empty()) return Status(Code::kInvalidPath, "empty file name");
  if (name.find('\0') != std::string_view::npos)
    return Status(Code::kInvalidPath, "file name contains a NUL byte");
  if (name.find('/') != std::string_view::npos)
    return Status(Code::kInvalidPath, fmt::format("file name '{}' contains '/'", name));
  if (name == "." || name == "..")
    return Status(Code::kInvalidPath, fmt::format("file name '{}' is not allowed", name));
  if (name.size() > NAME_MAX)
    return Status(Code::kInvalidPath, fmt::format("file name is {} bytes long; the limit is {}",
                                                  name.size(), NAME_MAX));
  return Status::Ok();
}

Result<std::vector<std::string>> SplitRelPath(std::string_view rel) {
  if (rel.find('\0') != std::string_view::npos)
    return Status(Code::kInvalidPath, "path contains a NUL byte");
  if (rel.size() >= PATH_MAX)
    return Status(Code::kInvalidPath,
                  fmt::format("path is {} bytes long; the limit is {}", rel.size(), PATH_MAX - 1));
  if (!rel.empty() && rel.front() == '/')
    return Status(Code::kInvalidPath, fmt::format("absolute path '{}' is not allowed", rel));
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos <= rel.size()) {
    size_t end = rel.find('/', pos);
    if (end == std::string_view::npos) end = rel.size();
    std::string_view comp = rel.substr(pos, end - pos);
    pos = end + 1;
    if (comp.empty() || comp == ".") continue;
    if (comp == "..")
      return Status(Code::kInvalidPath, fmt::format("path '{}' contains '..'", rel));
    if (comp.size() > NAME_MAX)
      return Status(Code::kInvalidPath, fmt::format("a component of the path is {} bytes long; "
                                                    "the limit is {}",
                                                    comp.size(), NAME_MAX));
    parts.emplace_back(comp);
  }
  return parts;
}

std::string JoinComponents(const std::vector<std::string>& parts, size_t n) {
  if (n == 0) return ".";
  std::string out;
  for (size_t i = 0; i < n && i < parts.size(); ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out;
}

namespace {

Result<UniqueFd> OpenResolved(int dirfd, std::string_view rel, int flags, mode_t mode,
                              Lookup lookup, bool follow) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(rel));
  std::string path = JoinComponents(parts, parts.size());
  struct open_how how {};
  how.flags = static_cast<unsigned long long>(flags | O_CLOEXEC);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  if (!follow) how.resolve |= RESOLVE_NO_SYMLINKS;
  if (lookup == Lookup::kCachedOnly) how.resolve |= RESOLVE_CACHED;
  for (int again = 0;; ++again) {
    long fd = SysOpenat2(dirfd, path.c_str(), &how);
    if (fd >= 0) return UniqueFd(static_cast<int>(fd));
    int err = errno;
    if (err == EAGAIN && lookup == Lookup::kCachedOnly)
      return Status(Code::kUnavailable, fmt::format("'{}' is not in the lookup cache", rel), err);
    if (err == EINTR) continue;
    // RESOLVE_BENEATH's answer to a rename racing the lookup: retried, a few times. EAGAIN
    // (EWOULDBLOCK) is also what an O_NONBLOCK open gets from a file another process holds a
    // write lease on, which lasts up to the lease-break time: not spun on.
    if (err == EAGAIN && again < 8) continue;
    if (err == EAGAIN)
      return Status(Code::kUnavailable,
                    fmt::format("'{}' is busy (another process holds a lease on it)", rel), err);
    if (err == ELOOP)  // never an escape: RESOLVE_BENEATH says that with EXDEV
      return Status(Code::kInvalidPath,
                    follow ? fmt::format("path '{}': too many levels of symbolic links (a loop, "
                                         "or a /proc magic link)",
                                         rel)
                           : fmt::format("path '{}' passes through a symbolic link", rel),
                    err);
    if (err == EXDEV)
      return Status(Code::kInvalidPath, fmt::format("path '{}' resolves outside the folder", rel),
                    err);
    return Status::FromErrno(err, fmt::format("open '{}'", rel));
  }
}

}  // namespace

Result<UniqueFd> OpenBeneath(int dirfd, std::string_view rel, int flags, mode_t mode,
                             Lookup lookup) {
  return OpenResolved(dirfd, rel, flags, mode, lookup, /*follow=*/true);
}

Result<UniqueFd> OpenBeneathNoSymlinks(int dirfd, std::string_view rel, int flags) {
  return OpenResolved(dirfd, rel, flags, 0, Lookup::kMayBlock, /*follow=*/false);
}

Result<ParentRef> OpenParentBeneath(int rootfd, std::string_view rel) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(rel));
  if (parts.empty())
    return Status(Code::kInvalidPath, "the operation needs a path below the folder root");
  std::string parent = JoinComponents(parts, parts.size() - 1);
  SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, OpenBeneath(rootfd, parent, O_PATH | O_DIRECTORY));
  return ParentRef{std::move(dir), parts.back()};
}

Result<UniqueFd> OpenDirPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("open directory '{}'", path));
  return UniqueFd(fd);
}

}  // namespace sluice
