// A loop-mounted test filesystem shared by the tests of one test process, made by one of the
// tools in tests/tools (btrfs-loop.sh: btrfs with qgroups; xfs-loop.sh: XFS with reflinks and
// mount options from $SLUICE_XFS_MOUNT_OPTS; ext4-loop.sh: plain ext4). The tool creates it on
// first use (sparse image under /tmp, mkfs, losetup, mount); it is unmounted, detached and
// removed when the test program ends, and leftovers of a crashed run are swept at the next start.
#pragma once

#include <string>

namespace sluice::test {

// Runs `cmd` through the shell; returns its exit status and puts stdout+stderr in `out`.
int RunCommand(const std::string& cmd, std::string* out);

class LoopFs {
 public:
  // The process-wide instance for filesystem `name` ("btrfs", "xfs", "ext4"), set up on first
  // call with an image of `size`. ok() is false when that failed (tests then fail with error();
  // they are never skipped).
  static LoopFs& Shared(const std::string& name, const std::string& size);
  static LoopFs& Btrfs() { return Shared("btrfs", "1G"); }
  static LoopFs& Xfs() { return Shared("xfs", "512M"); }
  static LoopFs& Ext4() { return Shared("ext4", "256M"); }

  bool ok() const { return !mount_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& mount() const { return mount_; }
  const std::string& device() const { return device_; }

  // A fresh directory on the filesystem (removed with it).
  std::string MakeTempDir(const std::string& prefix) const;

  void TearDown();

 private:
  explicit LoopFs(std::string name) : name_(std::move(name)) {}
  void SetUp(const std::string& size);

  std::string name_;
  std::string dir_;    // /tmp/sluice-<name>-<pid>-XXXXXX: image, loop device name, mount point
  std::string mount_;  // dir_/mnt once mounted
  std::string device_;
  std::string error_;
};

}  // namespace sluice::test
