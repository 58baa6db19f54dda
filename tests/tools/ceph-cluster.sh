#!/usr/bin/env bash
# Test tooling: a throw-away single-node Ceph 16.2 cluster with one CephFS, mounted with ceph-fuse,
# for the cephfs backend's tests and benchmarks.
#
#   ceph-cluster.sh up DIR [SIZE]  everything under DIR: ceph.conf, mon/osd/mds data, logs, admin
#                                  sockets, pid files (nothing in /etc/ceph or /var/lib/ceph).
#                                  One mon on a free 127.0.0.1 port (msgr2 only), one memstore OSD
#                                  of SIZE bytes of RAM (default 1G), pools of size 1, `auth none`,
#                                  one MDS, `ceph fs new`; ceph-fuse mounts the file system on
#                                  DIR/mnt. Prints the mount point as the last line. DIR/owner
#                                  holds the pid that owns the cluster ($SLUICE_CEPH_OWNER, else
#                                  the caller). A failed `up` leaves nothing behind.
#   ceph-cluster.sh rgw DIR        adds a Ceph RGW (radosgw, beast frontend) to the cluster in DIR,
#                                  on a free 127.0.0.1 port, with one S3 user; prints
#                                  "ENDPOINT ACCESS_KEY SECRET_KEY" as the last line (also in
#                                  DIR/rgw). Its pools are made on first use. ~3 s.
#   ceph-cluster.sh down DIR       unmounts, stops the daemons by their pid files (TERM, then
#                                  KILL), removes DIR. Idempotent.
#   ceph-cluster.sh sweep          runs `down` on every /tmp/sluice-ceph-* whose owner is gone
#                                  (leftovers of a test process that crashed).
#
# Starts in ~10-15 s on 2 cores; `down` takes ~5 s. Other programs use the cluster with
# `ceph -c DIR/ceph.conf`, `ceph-fuse -c DIR/ceph.conf --id NAME MNT` or libcephfs with that conf
# (any client name; no keyring). Settings that differ from Ceph's defaults, and why, are commented
# in write_conf below: quotas are enforced by the client (client quota = true, as by default) and
# rstats propagate every ~1 s instead of every ~5 s (ceph.dir.rbytes three levels up follows a
# write in ~1-2 s instead of ~5-8 s). $SLUICE_CEPH_CONF, if set, is appended to ceph.conf, and
# a later setting overrides an earlier one (e.g. $'[mds]\nmds tick interval = 5').
# A ceph-mgr runs only for the usage figures: without one, statfs on the mount reports zero
# sizes (and `ceph df` nothing); CephFS, quotas and rstats work without it.
# Needs root and ceph-mon, ceph-mgr, ceph-osd, ceph-mds, ceph-fuse, ceph-common, and radosgw for
# `rgw` (scripts/install-deps.sh).
# The mount is removed with umount (root; Debian's ceph-fuse uses libfuse2, no fusermount3).
# Every step is bounded by a timeout; nothing waits forever.
set -euo pipefail

OWNER=${SLUICE_CEPH_OWNER:-$PPID}
DEFAULT_SIZE=1G
FS_NAME=cephfs
FUSE_ID=fuse  # client.fuse: the mount's client name (pid file run/client.fuse.pid)
T0=$EPOCHREALTIME

die() {
  echo "ceph-cluster: $*" >&2
  exit 1
}

note() {
  local ms=$(((${EPOCHREALTIME/./} - ${T0/./}) / 1000))
  printf 'ceph-cluster: [%d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}

# On a failed `up`: the end of every log, before `down` removes them.
dump_logs() {
  local f
  for f in "$dir"/log/*; do
    [ -s "$f" ] || continue
    echo "--- $f (last 20 lines) ---" >&2
    tail -n 20 "$f" >&2
  done
}

# ceph CLI against the cluster in $dir; never hangs.
cephc() {
  timeout 30 ceph -c "$dir/ceph.conf" --connect-timeout 5 "$@"
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.5 s until it succeeds.
wait_for() {
  local secs=$1 what=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${secs}s waiting for $what"
    sleep 0.5
  done
}

# The mount point is looked up in the mount table: stat() on a hung FUSE mount would block.
is_mounted() {
  local m
  m=$(printf '%s' "$1" | sed 's/ /\\040/g')
  awk -v m="$m" '$2 == m { found = 1 } END { exit !found }' /proc/self/mounts
}

# A free port below the kernel's ephemeral range: a port from bind(0) lies inside it, where an
# outgoing connection could take it before the mon binds it.
free_port() {
  python3 -c 'import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randint(10000, max(10001, lo - 1))))
    except OSError:
        continue
    print(s.getsockname()[1])
    break'
}

# Pids of this cluster's daemons: their pid files, plus any process whose command line names this
# DIR's ceph.conf (a daemon killed before it wrote its pid file, or a pid file already removed).
cluster_pids() {
  local dir=$1 f pid p
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    # Only if that pid is still one of ours (not a reused pid).
    if [[ "$pid" =~ ^[0-9]+$ ]] && names_conf "/proc/$pid" "$dir"; then echo "$pid"; fi
  done
  for p in /proc/[0-9]*; do
    if names_conf "$p" "$dir"; then echo "${p#/proc/}"; fi
  done
}

# names_conf /proc/PID DIR: whether that process was started with DIR/ceph.conf as an argument.
names_conf() {
  tr '\0' '\n' 2>/dev/null <"$1/cmdline" | grep -qxF "$2/ceph.conf"
}

down() {
  local dir=$1 p
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd -P)
  if is_mounted "$dir/mnt"; then
    # A process that just exited may still hold the mount for a moment: retry EBUSY for ~1 s,
    # then detach it lazily. `-c`: umount must not stat() the mount point, which blocks while
    # the client hangs; killing the client below fails any request still waiting on it.
    local _
    for _ in 1 2 3 4 5; do
      timeout -k 1 5 umount -c "$dir/mnt" 2>/dev/null && break
      sleep 0.2
    done
    if is_mounted "$dir/mnt"; then
      timeout -k 1 5 umount -l -c "$dir/mnt" || true
    fi
  fi
  # TERM everything at once, wait up to 3 s, then KILL: nothing here is worth saving (the mon,
  # mgr and OSD take ~2 s to exit on TERM, the MDS ~5 s).
  local pids
  pids=$(cluster_pids "$dir" | sort -u | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    # shellcheck disable=SC2086  # a list of pids
    kill -TERM $pids 2>/dev/null || true
    local deadline=$((SECONDS + 3)) alive=1
    while [ "$alive" -eq 1 ] && [ "$SECONDS" -lt "$deadline" ]; do
      alive=0
      for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ "$alive" -eq 0 ] || sleep 0.2
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    for p in $pids; do
      local n=0
      while kill -0 "$p" 2>/dev/null && [ "$n" -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
    done
  fi
  if is_mounted "$dir/mnt"; then
    timeout -k 1 5 umount -l -c "$dir/mnt" || true
  fi
  # Never recurse into a mount that is still there.
  is_mounted "$dir/mnt" && die "cannot unmount $dir/mnt"
  rm -rf --one-file-system "$dir"
}

write_conf() {
  local port=$1 fsid=$2 size=$3
  cat >"$dir/ceph.conf" <<EOF
# Throw-away single-node test cluster made by tests/tools/ceph-cluster.sh; removed by \`down\`.
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$port]
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
crash dir = $dir/crash
mon cluster log file = $dir/log/cluster.log
mon data avail warn = 2
mon data avail crit = 1
mon warn on insecure global id reclaim allowed = false
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = $size
# The MDS sends its state to the mon every second instead of every 4 (faster start).
mds beacon interval = 1

[mon]
mon data = $dir/mon

[mgr]
mgr data = $dir/mgr
# Modules enabled at mkfs (the always-on ones load anyway); the default adds restful, which
# wants a certificate.
mgr initial modules = iostat
# Usage figures (statfs on the mount, \`ceph df\`) reach the mon every second instead of every 5.
mgr stats period = 1
mon mgr digest period = 1

[osd]
osd data = $dir/osd

[mds]
mds data = $dir/mds
mds cache memory limit = 268435456
# Dirty rstats (ceph.dir.rbytes, rentries, the figures quotas are checked against) reach the
# directories above a change when the MDS nudges its scatter locks, which it checks on its tick:
# both every 5 s by default. At 1 s, rbytes three levels up follows an fsync in ~1.3-1.9 s
# (~5.5-7 s with the defaults; bench/bench_ceph_overshoot.py).
mds tick interval = 1
mds scatter nudge interval = 1

[client.rgw]
rgw data = $dir/rgw.data
# With \`auth none\` no connection can be "secure" (that needs cephx's session keys), and
# radosgw asks for secure mon connections by default: it would never get past AUTH_CONNECTING.
ms mon client mode = crc
ms client mode = crc
rgw enable usage log = false
rgw thread pool size = 64

[client]
client mount timeout = 30
client quota = true
# A client sends the sizes of files it wrote (closed without fsync) to the MDS when it lets go
# of their dirty caps: 5 s after the last use by default, 1 s here.
client caps release delay = 1
# This machine's ceph-fuse cannot remount to trim kernel dentries; keep running when it fails.
client die on failed dentry invalidate = false
EOF
  if [ -n "${SLUICE_CEPH_CONF:-}" ]; then
    printf '\n# From SLUICE_CEPH_CONF\n%s\n' "$SLUICE_CEPH_CONF" >>"$dir/ceph.conf"
  fi
}

failed_up() {
  local rc=$?
  trap - EXIT
  dump_logs
  down "$dir" || true
  exit "$rc"
}

up() {
  local size=$2
  dir=$1
  [ "$(id -u)" -eq 0 ] || die "needs root (FUSE mount)"
  local c
  for c in ceph ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse monmaptool; do
    command -v "$c" >/dev/null || die "$c not found: run scripts/install-deps.sh"
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd -P)
  [ ! -e "$dir/ceph.conf" ] || die "$dir already holds a cluster"
  mkdir -p "$dir"/{mon,mgr,osd,mds,log,run,crash,mnt}
  echo "$OWNER" >"$dir/owner"
  # Anything that fails from here on (or an interrupt) leaves nothing behind.
  trap failed_up EXIT
  trap 'exit 130' INT TERM HUP

  local port fsid
  port=$(free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$port" "$fsid" "$size"
  : >"$dir/keyring"

  timeout 30 monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" \
    "$dir/monmap" >/dev/null
  timeout 30 ceph-mon -c "$dir/ceph.conf" -i a --mkfs --monmap "$dir/monmap" \
    >>"$dir/log/mkfs.out" 2>&1
  timeout 30 ceph-mon -c "$dir/ceph.conf" -i a </dev/null >>"$dir/log/daemons.out" 2>&1
  wait_for 30 "the monitor (ceph -s)" cephc -s
  note "mon up on 127.0.0.1:$port"
  local mon_up=$SECONDS
  # The mgr only feeds usage figures to the mon (statfs on the mount, ceph df); it loads its
  # Python modules while the rest starts. Daemons fork once they have initialised (1-2 s each):
  # start them in the background and collect their launchers below.
  local launchers=()
  timeout 30 ceph-mgr -c "$dir/ceph.conf" -i x </dev/null >>"$dir/log/daemons.out" 2>&1 &
  launchers+=($!)

  # Mon-only steps first: the OSD's id, the pools, the file system. The MDS waits as a standby
  # until it is given the file system's rank 0, and creates it once the OSD is up.
  local uuid id
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(cephc osd new "$uuid" 2>>"$dir/log/setup.out")
  [ "$id" = 0 ] || die "ceph osd new gave id '$id'"
  {
    cephc osd pool create cephfs_metadata
    cephc osd pool create cephfs_data
    cephc fs new "$FS_NAME" cephfs_metadata cephfs_data
  } >>"$dir/log/setup.out" 2>&1
  timeout 30 ceph-mds -c "$dir/ceph.conf" -i a </dev/null >>"$dir/log/daemons.out" 2>&1 &
  launchers+=($!)

  # An OSD started less than ~3 s after the mon first answers can fail with "wrong fsid".
  while [ $((SECONDS - mon_up)) -lt 4 ]; do sleep 0.2; done
  timeout 60 ceph-osd -c "$dir/ceph.conf" -i 0 --mkfs --osd-uuid "$uuid" >>"$dir/log/mkfs.out" 2>&1
  timeout 30 ceph-osd -c "$dir/ceph.conf" -i 0 </dev/null >>"$dir/log/daemons.out" 2>&1 &
  launchers+=($!)
  local pid
  for pid in "${launchers[@]}"; do wait "$pid"; done
  wait_for 60 "the OSD to be up" osd_up
  note "osd up"
  wait_for 60 "the MDS to be up:active (ceph mds stat)" mds_active
  note "mds active"

  timeout 60 ceph-fuse -c "$dir/ceph.conf" --id "$FUSE_ID" "$dir/mnt" </dev/null \
    >>"$dir/log/daemons.out" 2>&1
  wait_for 30 "the ceph-fuse mount" is_mounted "$dir/mnt"
  note "mounted on $dir/mnt"
  # statfs reports zero sizes until the mgr's first usage digest reaches the mon.
  wait_for 60 "statfs sizes on the mount (the mgr's usage digest)" statfs_ready
  note "statfs ready"
  trap - EXIT INT TERM HUP
  echo "$dir/mnt"
}

statfs_ready() {
  [ "$(timeout 10 stat -f -c %b "$dir/mnt")" -gt 0 ]
}

osd_up() {
  cephc osd stat 2>/dev/null | grep -q ' 1 up'
}

mds_active() {
  cephc mds stat 2>/dev/null | grep -q 'up:active'
}

rgw() {
  dir=$1
  [ -f "$dir/ceph.conf" ] || die "no cluster in $dir"
  dir=$(cd "$dir" && pwd -P)
  command -v radosgw >/dev/null || die "radosgw not found: run scripts/install-deps.sh"
  [ ! -e "$dir/rgw" ] || die "$dir already has an RGW: $(cat "$dir/rgw")"
  mkdir -p "$dir/rgw.data"
  local port ak sk
  port=$(free_port)
  # radosgw forks once it is connected and serving; tcp_nodelay as any HTTP server sets it.
  timeout 60 radosgw -c "$dir/ceph.conf" -n client.rgw --rgw-data "$dir/rgw.data" \
    --rgw-frontends "beast endpoint=127.0.0.1:$port tcp_nodelay=1" </dev/null \
    >>"$dir/log/daemons.out" 2>&1 || die "radosgw did not start (log/client.rgw.log)"
  wait_for 30 "radosgw to answer on $port" curl -s -o /dev/null "http://127.0.0.1:$port/"
  ak=$(python3 -c 'import secrets; print("RGW" + secrets.token_hex(8).upper())')
  sk=$(python3 -c 'import secrets; print(secrets.token_urlsafe(30))')
  timeout 60 radosgw-admin -c "$dir/ceph.conf" user create --uid sluice-tests \
    --display-name "Sluice tests" --access-key "$ak" --secret-key "$sk" >>"$dir/log/setup.out" 2>&1 ||
    die "radosgw-admin user create failed (log/setup.out)"
  echo "http://127.0.0.1:$port $ak $sk" >"$dir/rgw"
  note "rgw up on 127.0.0.1:$port"
  cat "$dir/rgw"
}

sweep() {
  local d pid
  for d in /tmp/sluice-ceph-*; do
    [ -d "$d" ] || continue
    pid=$(cat "$d/owner" 2>/dev/null || echo "")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    # No owner yet: another process may be between mkdtemp and `up`.
    if [ -z "$pid" ] && [ -n "$(find "$d" -maxdepth 0 -mmin -1)" ]; then continue; fi
    down "$d"
  done
}

dir=""
case "${1:-}" in
  up)
    [ $# -ge 2 ] || die "usage: $0 up DIR [SIZE]"
    up "$2" "$(numfmt --from=iec "${3:-$DEFAULT_SIZE}")"
    ;;
  down) [ $# -eq 2 ] || die "usage: $0 down DIR"; down "$2" ;;
  rgw) [ $# -eq 2 ] || die "usage: $0 rgw DIR"; rgw "$2" ;;
  sweep) sweep ;;
  *) die "usage: $0 up DIR [SIZE] | rgw DIR | down DIR | sweep" ;;
esac
