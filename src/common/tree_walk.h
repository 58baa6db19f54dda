// Tree walks by descriptor, iteratively, with a bounded number of open descriptors and no path
// string that grows with depth (the invariant of docs/decisions.md "Walks go by descriptor").
//
// Every directory is entered with openat(parent, name, O_NOFOLLOW | O_DIRECTORY): a directory
// swapped for a symbolic link mid-walk is refused, never followed out of the tree. Only the
// innermost `max_open` directories stay open; the ones above are closed and re-opened through
// ".." when the walk climbs back to them, and checked against the device and inode seen on the
// way down, so a directory moved elsewhere mid-walk ends the walk (kConflict) instead of taking
// it somewhere else. A 10,000-deep tree walks with 8 descriptors and a path-free stack.
#pragma once

#include <dirent.h>
#include <sys/stat.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "common/dir_reader.h"
#include "common/fd.h"
#include "common/status.h"

namespace sluice {

// The directories from a walk's root to the one at hand.
class DirStack {
 public:
  explicit DirStack(size_t max_open = 8) : max_open_(max_open < 1 ? 1 : max_open) {}
  // Enters `dir` (an O_RDONLY directory descriptor: the root, or a child of top()).
  Status Push(UniqueFd dir);
  // Leaves the top directory. The one below is open again afterwards, checked to be the same
  // directory that was entered.
  Status Pop();
  int top() const { return levels_.back().fd.get(); }
  size_t depth() const { return levels_.size(); }
  bool empty() const { return levels_.empty(); }

 private:
  struct Level {
    UniqueFd fd;  // closed while deeper levels hold the descriptors
    dev_t dev;
    ino_t ino;
  };
  size_t max_open_;
  std::vector<Level> levels_;
};

enum class WalkAction { kDescend, kSkip, kStop };

struct WalkEntry {
  int dirfd;                // the directory holding the entry
  const std::string& name;  // relative to dirfd
  unsigned char type;       // DT_DIR, DT_REG, DT_LNK, ... (never DT_UNKNOWN)
  size_t depth;             // 1 for the root's entries
};

struct TreeVisitor {
  // Every entry below the root. For a directory, kDescend enters it; kStop ends the walk.
  std::function<Result<WalkAction>(const WalkEntry&)> entry;
  // A directory was entered: `dirfd` is its descriptor (children are created there).
  std::function<Status(const WalkEntry&, int dirfd)> enter;
  // A directory's contents are done: called with its parent's descriptor and its name.
  std::function<Status(int parent_fd, const std::string& name, size_t depth)> leave;
};

// Walks the tree below the directory `root` (any descriptor of it, O_PATH included), depth
// first. Entries that vanish mid-walk are passed over; a directory that cannot be entered
// otherwise (ENOTDIR, ELOOP: replaced by a file or a symbolic link) ends the walk with an
// error naming it.
Status WalkTree(int root, const TreeVisitor& visitor, size_t max_open = 8);

// What a walk removed or found: entries (files, directories, symbolic links) and the apparent
// size of the non-directories.
struct TreeCount {
  uint64_t entries = 0;
  uint64_t bytes = 0;
};

// Counts everything below `root` (not the root itself).
Result<TreeCount> CountTree(int root, size_t max_open = 8);

// A backend's faster way to remove a whole directory (a btrfs subvolume in one ioctl): true
// when it removed `name` of `parent` itself, false to let the walk empty and remove it.
using DirRemover = std::function<Result<bool>(int parent, const std::string& name)>;

// Removes `name` (a file, a symbolic link or a whole tree) inside `dirfd` without following
// symbolic links, iteratively. `removed`, when given, receives what went, also when it stops at
// an error part way (what a DirRemover removed is not counted). Entries created while it runs
// are removed too.
Status RemoveTreeAt(int dirfd, const std::string& name, TreeCount* removed = nullptr,
                    const DirRemover& remover = nullptr);

// Copies the tree below `src` into the existing directory `dst`: regular files (reflinked where
// the file system can), directories (their modes and times set last, so that read-only
// directories can be filled) and symbolic links (as links, never followed). Sockets, fifos and
// devices carry no data and are left out.
Status CopyTreeInto(int src, int dst, size_t max_open = 8);

// Copies one regular file's contents: FICLONE, then copy_file_range, then read/write.
Status CopyFileContents(int src_fd, int dst_fd, uint64_t size);

// Copies the regular file `name` of `sdir` into `ddir` under the same name, with its owner, mode
// and times (as found on the file opened).
Status CopyOneFile(int sdir, int ddir, const std::string& name);

// Gives a copy (open at `fd`, or `name` in `dirfd`) the source's owner where the process may
// (as root) and its mode, the set-id bits only with the owner, as `cp -a` does: a copy never
// turns a user's set-uid file into one of the daemon's.
void CopyOwnerAndMode(int fd, const struct stat& sb);
void CopyOwnerAndModeAt(int dirfd, const std::string& name, const struct stat& sb);

// Copies the symbolic link `name` of `sdir` into `ddir`.
Status CopySymlink(int sdir, int ddir, const std::string& name, const struct stat& sb);

}  // namespace sluice
