#!/usr/bin/env bash
# Test tooling: a loop-mounted XFS image (reflink=1), for the xfs backend's tests.
#
#   xfs-loop.sh up DIR [SIZE]  sparse image DIR/xfs.img (default 512M), mkfs.xfs -m reflink=1,
#                              losetup, mount on DIR/mnt; prints the mount point. Mount options
#                              come from $SLUICE_XFS_MOUNT_OPTS (default none: this project's
#                              kernel has no XFS quota support, so `prjquota` mounts fail; on a
#                              kernel with CONFIG_XFS_QUOTA set it to `prjquota` to test limits).
#                              DIR/owner holds the pid of the process that owns the mount
#                              ($SLUICE_XFS_OWNER, else the caller).
#   xfs-loop.sh down DIR       unmounts, detaches the loop device, removes DIR. Idempotent.
#   xfs-loop.sh sweep          runs `down` on every /tmp/sluice-xfs-* whose owner is gone
#                              (leftovers of a test process that crashed).
#
# Needs root, util-linux and xfsprogs (scripts/install-deps.sh installs them). The shared
# up/down/sweep logic is in loopfs.sh.
set -euo pipefail

NAME=xfs
DEFAULT_SIZE=512M
OWNER=${SLUICE_XFS_OWNER:-$PPID}
source "$(dirname "$0")/loopfs.sh"

make_fs() {
  command -v mkfs.xfs >/dev/null || die "mkfs.xfs not found: install xfsprogs"
  mkfs.xfs -q -f -m reflink=1 "$1" >/dev/null
}

mount_fs() {
  if [ -n "${SLUICE_XFS_MOUNT_OPTS:-}" ]; then
    mount -t xfs -o "$SLUICE_XFS_MOUNT_OPTS" "$1" "$2"
  else
    mount -t xfs "$1" "$2"
  fi
}

loopfs_main "$@"
