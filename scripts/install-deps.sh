#!/usr/bin/env bash
# Installs every Debian 12 package that building, running and testing Sluice needs.
# Idempotent; run as root (or with sudo available).
set -euo pipefail

PKGS=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config git clang-format
  # libraries
  libboost1.74-dev libssl-dev nlohmann-json3-dev libtoml11-dev libspdlog-dev libfmt-dev
  libcli11-dev libsqlite3-dev libbtrfsutil-dev libarchive-dev libhiredis-dev libpugixml-dev
  libisal-dev zlib1g-dev libcurl4-openssl-dev
  # tests
  libgtest-dev libgmock-dev libbenchmark-dev python3 python3-pytest python3-requests curl openssl
  unzip  # `unzip -t` checks the ZIP streams of archive downloads
  btrfs-progs  # mkfs.btrfs and `btrfs quota enable` for the loop-mounted test filesystem
  xfsprogs  # mkfs.xfs for the loop-mounted XFS test filesystem (project ids, reflinks)
  # single-node CephFS of tests/tools/ceph-cluster.sh (memstore OSD, ceph-fuse mount), never
  # started as services. ceph-mgr only reports usage (statfs on the mount is zero without it);
  # ceph-mds depends on it anyway (through the `ceph` package).
  ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common
  radosgw  # Ceph RGW (ceph-cluster.sh rgw): the S3 peer of the differential tests and benchmarks
  attr  # getfattr/setfattr for ceph.quota.* and ceph.dir.r* on the CephFS mount
  # Backend.AI event bus of tests/integration/eventbus.py: Redis stream and etcd config, started
  # by the tests on their own ports, never as services
  redis-server etcd-server etcd-client python3-redis python3-msgpack
  # S3 clients of the S3 API's tests (tests/integration/test_s3*.py); s3fs mounts with FUSE
  python3-boto3 awscli s3cmd rclone s3fs
  # benchmarks
  wrk
  nginx  # the peer of bench/bench_download.py (started by the script, never as a service)
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages already installed"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  # The postinst scripts of redis-server, etcd-server, nginx and ceph-* would start their
  # services (invoke-rc.d and deb-systemd-invoke both ask policy-rc.d); the tests start their own.
  # Where the machine has no policy-rc.d, one that denies every start is in place meanwhile.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Node packages of the tests (tus-js-client, tests/tus-client), pinned by its package-lock.json.
# Node.js and npm come with the machine; Debian's are the fallback.
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
# Node packages of the tests, each pinned by its package-lock.json: tus-js-client
# (tests/tus-client) and the AWS SDK for JavaScript v3 (tests/s3-js-client).
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
for dir in tests/tus-client tests/s3-js-client; do
  if [ ! -f "$ROOT/$dir/node_modules/.package-lock.json" ] ||
    [ "$ROOT/$dir/package-lock.json" -nt "$ROOT/$dir/node_modules/.package-lock.json" ]; then
    echo "install-deps: npm ci in $dir"
    npm ci --prefix "$ROOT/$dir" --no-audit --no-fund
  else
    echo "install-deps: $dir node modules up to date"
  fi
done
