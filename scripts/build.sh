#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release). Usage: scripts/build.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
if [ ! -f "build/${preset}/build.ninja" ]; then
  cmake --preset "${preset}" >/dev/null
fi
cmake --build --preset "${preset}"
