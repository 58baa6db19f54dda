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
# Needs root, util-linux and xfsprogs (scripts/install-deps.sh installs them).
set -euo pipefail

die() {
  echo "xfs-loop: $*" >&2
  exit 1
}

down() {
  local dir=$1
  [ -d "$dir" ] || return 0
  if mountpoint -q "$dir/mnt" 2>/dev/null; then
    # A process that just exited may still hold the mount for a moment.
    local i
    for i in 1 2 3 4 5 6 7 8 9 10; do
      umount "$dir/mnt" 2>/dev/null && break
      sleep 0.2
    done
    if mountpoint -q "$dir/mnt" 2>/dev/null; then
      umount -l "$dir/mnt" || die "cannot unmount $dir/mnt"
    fi
  fi
  if [ -f "$dir/xfs.img" ]; then
    local dev
    for dev in $(losetup -n -O NAME -j "$dir/xfs.img" 2>/dev/null); do
      losetup -d "$dev" 2>/dev/null || true
    done
  fi
  rm -rf "$dir"
}

up() {
  local dir=$1 size=${2:-512M}
  [ "$(id -u)" -eq 0 ] || die "needs root (loop devices, mount)"
  command -v mkfs.xfs >/dev/null || die "mkfs.xfs not found: install xfsprogs"
  mkdir -p "$dir/mnt"
  echo "${SLUICE_XFS_OWNER:-$PPID}" >"$dir/owner"
  # Anything that fails from here on leaves nothing behind.
  trap 'down "$dir"' ERR
  truncate -s "$size" "$dir/xfs.img"
  mkfs.xfs -q -f -m reflink=1 "$dir/xfs.img" >/dev/null
  local dev
  dev=$(losetup --find --show "$dir/xfs.img")
  echo "$dev" >"$dir/loopdev"
  if [ -n "${SLUICE_XFS_MOUNT_OPTS:-}" ]; then
    mount -t xfs -o "$SLUICE_XFS_MOUNT_OPTS" "$dev" "$dir/mnt"
  else
    mount -t xfs "$dev" "$dir/mnt"
  fi
  trap - ERR
  echo "$dir/mnt"
}

sweep() {
  local dir pid
  for dir in /tmp/sluice-xfs-*; do
    [ -d "$dir" ] || continue
    pid=$(cat "$dir/owner" 2>/dev/null || echo "")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    # No owner yet: another process may be between mkdtemp and `up`.
    if [ -z "$pid" ] && [ -n "$(find "$dir" -maxdepth 0 -mmin -1)" ]; then continue; fi
    down "$dir"
  done
}

case "${1:-}" in
  up) [ $# -ge 2 ] || die "usage: $0 up DIR [SIZE]"; up "$2" "${3:-512M}" ;;
  down) [ $# -eq 2 ] || die "usage: $0 down DIR"; down "$2" ;;
  sweep) sweep ;;
  *) die "usage: $0 up DIR [SIZE] | down DIR | sweep" ;;
esac
