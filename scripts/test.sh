#!/usr/bin/env bash
# Builds the given preset (default: release) and runs the whole test suite through CTest:
# unit tests (GoogleTest) and integration tests (pytest against a real sluiced).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
scripts/build.sh "${preset}"
ctest --preset "${preset}" --timeout 900
