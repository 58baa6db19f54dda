// A loop-mounted btrfs filesystem with qgroups enabled, shared by the btrfs tests of one test
// process. tests/tools/btrfs-loop.sh creates it on first use (1 GiB sparse image under /tmp,
// mkfs.btrfs, losetup, mount, `btrfs quota enable`); it is unmounted, detached and removed when
// the test program ends, and leftovers of a crashed run are swept at the next start.
#pragma once

#include <string>

namespace sluice::test {

class BtrfsLoop {
 public:
  // The process-wide instance, set up on first call. ok() is false when that failed (tests then
  // fail with error(); they are never skipped).
  static BtrfsLoop& Shared();

  bool ok() const { return !mount_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& mount() const { return mount_; }

  // A fresh directory on the filesystem (removed with it).
  std::string MakeTempDir(const std::string& prefix) const;

  void TearDown();

 private:
  BtrfsLoop() = default;
  void SetUp();

  std::string dir_;    // /tmp/sluice-btrfs-<pid>-XXXXXX: image, loop device name, mount point
  std::string mount_;  // dir_/mnt once mounted
  std::string error_;
};

// Runs `cmd` with /bin/sh, stdout and stderr into `out`; returns the exit status (-1: not run).
int RunCommand(const std::string& cmd, std::string* out);

}  // namespace sluice::test
