// A loop-mounted XFS filesystem (reflink=1, no quota options: this project's kernel has no XFS
// quota support), shared by the xfs tests of one test process. tests/tools/xfs-loop.sh creates it
// on first use (512 MiB sparse image under /tmp, mkfs.xfs, losetup, mount; mount options from
// $SLUICE_XFS_MOUNT_OPTS, e.g. `prjquota` on a quota-enabled kernel); it is unmounted, detached
// and removed when the test program ends, and leftovers of a crashed run are swept at the next
// start.
#pragma once

#include <string>

namespace sluice::test {

class XfsLoop {
 public:
  // The process-wide instance, set up on first call. ok() is false when that failed (tests then
  // fail with error(); they are never skipped).
  static XfsLoop& Shared();

  bool ok() const { return !mount_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& mount() const { return mount_; }
  const std::string& device() const { return device_; }

  // A fresh directory on the filesystem (removed with it).
  std::string MakeTempDir(const std::string& prefix) const;

  void TearDown();

 private:
  XfsLoop() = default;
  void SetUp();

  std::string dir_;    // /tmp/sluice-xfs-<pid>-XXXXXX: image, loop device name, mount point
  std::string mount_;  // dir_/mnt once mounted
  std::string device_;
  std::string error_;
};

}  // namespace sluice::test
