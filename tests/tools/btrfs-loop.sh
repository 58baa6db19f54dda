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
# Needs root, util-linux and btrfs-progs (scripts/install-deps.sh installs them).
set -euo pipefail

die() {
  echo "btrfs-loop: $*" >&2
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
  if [ -f "$dir/btrfs.img" ]; then
    local dev
    for dev in $(losetup -n -O NAME -j "$dir/btrfs.img" 2>/dev/null); do
      losetup -d "$dev" 2>/dev/null || true
    done
  fi
  rm -rf "$dir"
}

up() {
  local dir=$1 size=${2:-1G}
  [ "$(id -u)" -eq 0 ] || die "needs root (loop devices, mount)"
  command -v mkfs.btrfs >/dev/null || die "mkfs.btrfs not found: install btrfs-progs"
  mkdir -p "$dir/mnt"
  echo "${SLUICE_BTRFS_OWNER:-$PPID}" >"$dir/owner"
  # Anything that fails from here on leaves nothing behind.
  trap 'down "$dir"' ERR
  truncate -s "$size" "$dir/btrfs.img"
  mkfs.btrfs -q -f "$dir/btrfs.img" >/dev/null
  local dev
  dev=$(losetup --find --show "$dir/btrfs.img")
  echo "$dev" >"$dir/loopdev"
  mount -t btrfs "$dev" "$dir/mnt"
  btrfs quota enable "$dir/mnt"
  # Enabling starts a rescan; accounting is marked inconsistent until it ends.
  btrfs quota rescan -W "$dir/mnt" >/dev/null
  trap - ERR
  echo "$dir/mnt"
}

sweep() {
  local dir pid
  for dir in /tmp/sluice-btrfs-*; do
    [ -d "$dir" ] || continue
    pid=$(cat "$dir/owner" 2>/dev/null || echo "")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    # No owner yet: another process may be between mkdtemp and `up`.
    if [ -z "$pid" ] && [ -n "$(find "$dir" -maxdepth 0 -mmin -1)" ]; then continue; fi
    down "$dir"
  done
}

case "${1:-}" in
  up) [ $# -ge 2 ] || die "usage: $0 up DIR [SIZE]"; up "$2" "${3:-1G}" ;;
  down) [ $# -eq 2 ] || die "usage: $0 down DIR"; down "$2" ;;
  sweep) sweep ;;
  *) die "usage: $0 up DIR [SIZE] | down DIR | sweep" ;;
esac
