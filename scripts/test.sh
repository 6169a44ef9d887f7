#!/usr/bin/env bash
# The test command: installs what is needed, builds, and runs the whole suite with
# ctest, first as a Release build and then under AddressSanitizer and
# UndefinedBehaviorSanitizer (set DUFU_TEST_SANITIZE=0 to skip that second pass).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"

"$root/scripts/build.sh" "$root/build" -DDUFU_BUILD_TESTS=ON
ctest --test-dir "$root/build" --output-on-failure --timeout 600 -j "$(nproc)"

if [[ "${DUFU_TEST_SANITIZE:-1}" != 0 ]]; then
  "$root/scripts/build.sh" "$root/build-sanitize" -DCMAKE_BUILD_TYPE=Debug -DDUFU_SANITIZE=ON \
    -DDUFU_BUILD_BENCHMARKS=OFF
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$root/build-sanitize" --output-on-failure --timeout 900 -j "$(nproc)" -LE slow
fi
