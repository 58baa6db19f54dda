#!/usr/bin/env bash
# Installs every Debian 12 package that building, running and testing Sluice needs.
# Idempotent; run as root (or with sudo available).
set -euo pipefail

PKGS=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config git clang-format
  # libraries
  libboost1.74-dev libssl-dev nlohmann-json3-dev libtoml11-dev libspdlog-dev libfmt-dev
  libcli11-dev libsqlite3-dev
  # tests
  libgtest-dev libgmock-dev libbenchmark-dev python3 python3-pytest python3-requests curl openssl
  # benchmarks
  wrk
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
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
