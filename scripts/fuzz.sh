#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan; preset `fuzz`) and runs each for SECONDS
# (default 30), keeping a corpus per target under build/fuzz/corpus. A crash stops with the
# reproducer in build/fuzz/crashes. Needs clang and libclang-rt-14-dev.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      targets: jwt path range config request tus http
#                                              sigv4 awschunked s3body
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(jwt path range config request tus http sigv4 awschunked s3body)
[ -f build/fuzz/build.ninja ] || cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]/#/fuzz_}"
mkdir -p build/fuzz/crashes
for t in "${targets[@]}"; do
  mkdir -p "build/fuzz/corpus/$t"
  echo "== fuzz_$t for ${secs}s"
  build/fuzz/bin/"fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 \
    -artifact_prefix=build/fuzz/crashes/"$t"- "build/fuzz/corpus/$t"
done
