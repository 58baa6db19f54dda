# Shared body of the loop-filesystem test tools (btrfs-loop.sh, xfs-loop.sh); sourced, not run.
# The tool sets NAME (btrfs, xfs), DEFAULT_SIZE, OWNER (pid that owns the mount) and defines
#   make_fs IMG        make the filesystem in the image file
#   mount_fs DEV MNT   mount it (and any set-up after mounting)
# then calls loopfs_main "$@":
#   up DIR [SIZE]  sparse image DIR/NAME.img, make_fs, losetup, mount_fs on DIR/mnt; prints the
#                  mount point. DIR/owner holds OWNER.
#   down DIR       unmounts, detaches the loop device, removes DIR. Idempotent.
#   sweep          runs `down` on every /tmp/sluice-NAME-* whose owner is gone (leftovers of a
#                  test process that crashed).

die() {
  echo "$NAME-loop: $*" >&2
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
  if [ -f "$dir/$NAME.img" ]; then
    local dev
    for dev in $(losetup -n -O NAME -j "$dir/$NAME.img" 2>/dev/null); do
      losetup -d "$dev" 2>/dev/null || true
    done
  fi
  rm -rf "$dir"
}

up() {
  local dir=$1 size=$2
  [ "$(id -u)" -eq 0 ] || die "needs root (loop devices, mount)"
  mkdir -p "$dir/mnt"
  echo "$OWNER" >"$dir/owner"
  # Anything that fails from here on leaves nothing behind.
  trap 'down "$dir"' ERR
  truncate -s "$size" "$dir/$NAME.img"
  make_fs "$dir/$NAME.img"
  local dev
  dev=$(losetup --find --show "$dir/$NAME.img")
  echo "$dev" >"$dir/loopdev"
  mount_fs "$dev" "$dir/mnt"
  trap - ERR
  echo "$dir/mnt"
}

sweep() {
  local dir pid
  for dir in /tmp/sluice-"$NAME"-*; do
    [ -d "$dir" ] || continue
    pid=$(cat "$dir/owner" 2>/dev/null || echo "")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    # No owner yet: another process may be between mkdtemp and `up`.
    if [ -z "$pid" ] && [ -n "$(find "$dir" -maxdepth 0 -mmin -1)" ]; then continue; fi
    down "$dir"
  done
}

loopfs_main() {
  case "${1:-}" in
    up) [ $# -ge 2 ] || die "usage: $0 up DIR [SIZE]"; up "$2" "${3:-$DEFAULT_SIZE}" ;;
    down) [ $# -eq 2 ] || die "usage: $0 down DIR"; down "$2" ;;
    sweep) sweep ;;
    *) die "usage: $0 up DIR [SIZE] | down DIR | sweep" ;;
  esac
}
