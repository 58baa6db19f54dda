// Path safety: every path inside a vfolder is resolved beneath the vfolder's directory fd with
// openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS). Strings are validated first so that hostile
// input (NUL bytes, absolute paths, "..", over-long names) is refused before any syscall.
#pragma once

#include <fcntl.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace sluice {

// Splits a relative path into its components after validation. "", "." and "./" mean the root
// (no components). Refuses NUL bytes, absolute paths, ".." components, names over NAME_MAX and
// paths over PATH_MAX with kInvalidPath.
Result<std::vector<std::string>> SplitRelPath(std::string_view rel);

// Validates a single path component (a new name for rename, say).
Status ValidateName(std::string_view name);

// Joins validated components with '/' ("." when empty).
std::string JoinComponents(const std::vector<std::string>& parts, size_t n);

// How a lookup may proceed. kCachedOnly (openat2 RESOLVE_CACHED) does no I/O and no
// revalidation: when the path is not entirely in the kernel's dentry cache it fails with
// kUnavailable (EAGAIN) at once, so an event loop can try it and leave the slow case to a pool.
enum class Lookup { kMayBlock, kCachedOnly };

// Opens `rel` beneath `dirfd`. Symlinks are followed only while they stay beneath `dirfd`;
// an escape yields kInvalidPath (EXDEV), as does a loop of links (ELOOP).
Result<UniqueFd> OpenBeneath(int dirfd, std::string_view rel, int flags, mode_t mode = 0,
                             Lookup lookup = Lookup::kMayBlock);
// As OpenBeneath, following no symbolic link at all (kInvalidPath, ELOOP, at the first one).
Result<UniqueFd> OpenBeneathNoSymlinks(int dirfd, std::string_view rel, int flags);

// The directory that holds the last component of `rel`, opened beneath `rootfd`, and that
// component's name. `rel` must have at least one component.
struct ParentRef {
  UniqueFd dir;
  std::string name;
};
Result<ParentRef> OpenParentBeneath(int rootfd, std::string_view rel);

// Opens a directory by absolute path (O_PATH | O_DIRECTORY | O_CLOEXEC).
Result<UniqueFd> OpenDirPath(const std::string& path);

}  // namespace sluice
