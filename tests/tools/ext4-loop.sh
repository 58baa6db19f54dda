#!/usr/bin/env bash
# Test tooling: a loop-mounted plain ext4 image, for the ext4 backend's tests.
#
#   ext4-loop.sh up DIR [SIZE]  sparse image DIR/ext4.img (default 256M), mkfs.ext4, losetup,
#                               mount on DIR/mnt; prints the mount point. Without the `project`
#                               feature: this project's kernel lacks CONFIG_QUOTA, and ext4 with
#                               that feature does not mount there. Mkfs options can be added with
#                               $SLUICE_EXT4_MKFS_OPTS (e.g. `-O project,quota -E
#                               quotatype=prjquota` on a quota-enabled kernel). DIR/owner holds
#                               the pid that owns the mount ($SLUICE_EXT4_OWNER, else the caller).
#   ext4-loop.sh down DIR       unmounts, detaches the loop device, removes DIR. Idempotent.
#   ext4-loop.sh sweep          runs `down` on every /tmp/sluice-ext4-* whose owner is gone.
#
# Needs root, util-linux and e2fsprogs. The shared up/down/sweep logic is in loopfs.sh.
set -euo pipefail

NAME=ext4
DEFAULT_SIZE=256M
OWNER=${SLUICE_EXT4_OWNER:-$PPID}
source "$(dirname "$0")/loopfs.sh"

make_fs() {
  command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 not found: install e2fsprogs"
  # shellcheck disable=SC2086  # options are words
  mkfs.ext4 -q -F ${SLUICE_EXT4_MKFS_OPTS:-} "$1" >/dev/null
}

mount_fs() {
  mount -t ext4 "$1" "$2"
}

loopfs_main "$@"
