#!/usr/bin/env bash
# Test tooling: a loop-mounted btrfs image with qgroups enabled, for the btrfs backend's tests.
#
#   btrfs-loop.sh up DIR [SIZE]  sparse image DIR/btrfs.img (default 1G), mkfs.btrfs, losetup,
#                                mount on DIR/mnt, `btrfs quota enable`; prints the mount point.
#                                DIR/owner holds the pid of the process that owns the mount
#                                ($SLUICE_BTRFS_OWNER, else the caller).
#   btrfs-loop.sh down DIR       unmounts, detaches the loop device, removes DIR. Idempotent.
#   btrfs-loop.sh sweep          runs `down` on every /tmp/sluice-btrfs-* whose owner is gone
#                                (leftovers of a test process that crashed).
#
# Needs root, util-linux and btrfs-progs (scripts/install-deps.sh installs them). The shared
# up/down/sweep logic is in loopfs.sh.
set -euo pipefail

NAME=btrfs
DEFAULT_SIZE=1G
OWNER=${SLUICE_BTRFS_OWNER:-$PPID}
source "$(dirname "$0")/loopfs.sh"

make_fs() {
  command -v mkfs.btrfs >/dev/null || die "mkfs.btrfs not found: install btrfs-progs"
  mkfs.btrfs -q -f "$1" >/dev/null
}

mount_fs() {
  mount -t btrfs "$1" "$2"
  btrfs quota enable "$2"
  # Enabling starts a rescan; accounting is marked inconsistent until it ends.
  btrfs quota rescan -W "$2" >/dev/null
}

loopfs_main "$@"
