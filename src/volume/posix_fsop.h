// FSOpModel over POSIX calls: parallel tree walk for usage, parallel copy that reflinks
// (FICLONE) or uses copy_file_range where the filesystem allows, fd-relative delete.
#pragma once

#include "common/fd.h"
#include "common/thread_pool.h"
#include "volume/volume.h"

namespace sluice {

class PosixFSOpModel : public FSOpModel {
 public:
  // `pool` runs the per-directory work of walks and copies; the caller blocks until done.
  // It must not be the pool the caller itself runs on.
  explicit PosixFSOpModel(ThreadPool* pool) : pool_(pool) {}

  Status CopyTree(const std::string& src, const std::string& dst) override;
  Status MoveTree(const std::string& src, const std::string& dst) override;
  Status DeleteTree(const std::string& path) override;
  Result<TreeUsage> ScanTree(const std::string& path) override;

 private:
  ThreadPool* pool_;
};

// Opens the directory that holds the last component of absolute `path` (with `flags` added to
// O_DIRECTORY | O_CLOEXEC) and names that component. An empty fd means the parent is missing.
struct PathParent {
  UniqueFd dir;
  std::string name;
};
Result<PathParent> OpenPathParent(const std::string& path, int flags);

// Removes `name` (file, symlink or whole directory tree) inside `dirfd` without following
// symlinks. `removed`, when given, receives what went (entries and bytes of non-directories),
// also when it stops at an error part way.
Status RemoveTreeAt(int dirfd, const std::string& name, TreeUsage* removed = nullptr);

// Copies one regular file's contents: FICLONE, then copy_file_range, then read/write.
Status CopyFileContents(int src_fd, int dst_fd, uint64_t size);

}  // namespace sluice
