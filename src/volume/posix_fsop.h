// FSOpModel over POSIX calls, by descriptor (common/tree_walk.h): usage walks, copies that
// reflink (FICLONE) or use copy_file_range where the file system allows, deletes. The subtrees
// below a root run in parallel on the scan pool, each walked iteratively with a bounded number
// of descriptors.
#pragma once

#include "common/fd.h"
#include "common/thread_pool.h"
#include "common/tree_walk.h"
#include "volume/volume.h"

namespace sluice {

class PosixFSOpModel : public FSOpModel {
 public:
  // `pool` runs the per-subtree work of walks and copies; the caller blocks until done.
  // It must not be the pool the caller itself runs on.
  explicit PosixFSOpModel(ThreadPool* pool) : pool_(pool) {}

  Status CopyTree(const std::string& src, const std::string& dst) override;
  Status MoveTree(const std::string& src, const std::string& dst) override;
  Status DeleteTree(const std::string& path) override;
  Result<TreeUsage> ScanTree(const std::string& path) override;

  // The same, from open directories (any descriptor of them, O_PATH included).
  Result<TreeCount> ScanTreeAt(int root);
  Status CopyTreeAt(int src, int dst);

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

}  // namespace sluice
