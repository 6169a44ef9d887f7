#!/usr/bin/env bash
# The test command: installs what is needed, builds, and runs the whole suite with
# ctest, first as a Release build and then under AddressSanitizer and
# UndefinedBehaviorSanitizer (set DUFU_TEST_SANITIZE=0 to skip that second pass);
# then the threaded tests under ThreadSanitizer (DUFU_TEST_TSAN=0 skips them) and
# every fuzz target for DUFU_TEST_FUZZ_SECONDS (30) each, two at a time
# (DUFU_TEST_FUZZ=0 skips them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Each pass's wall time, printed at the end (and when a pass fails): what CI spends where.
phase_times=()
phase_name=setup
phase_start=$SECONDS
next_phase() {
  phase_times+=("$(printf '%-28s %4d s' "$phase_name" $((SECONDS - phase_start)))")
  phase_name=$1
  phase_start=$SECONDS
}
print_phase_times() {
  next_phase done
  printf 'test.sh: %s\n' "${phase_times[@]}"
}
trap print_phase_times EXIT
"$root/scripts/setup.sh"
next_phase "release build"

"$root/scripts/build.sh" "$root/build" -DDUFU_BUILD_TESTS=ON
next_phase "release tests"
ctest --test-dir "$root/build" --output-on-failure --timeout 600 -j "$(nproc)"

if [[ "${DUFU_TEST_SANITIZE:-1}" != 0 ]]; then
  next_phase "asan+ubsan build"
  "$root/scripts/build.sh" "$root/build-sanitize" -DCMAKE_BUILD_TYPE=Debug -DDUFU_SANITIZE=ON \
    -DDUFU_BUILD_BENCHMARKS=OFF -DDUFU_FIXTURE_DIR="$root/build/test-fixtures"
  # The sanitizer build has no CUDA device (CMake refuses the two together), so the
  # tests labelled gpu could only start and skip there: a thousand processes saved.
  next_phase "asan+ubsan tests"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$root/build-sanitize" --output-on-failure --timeout 900 -j "$(nproc)" -LE "slow|gpu"
fi

# ThreadSanitizer: the tests of the threaded code that is not OpenMP (the preprocess
# pipeline, the loader, index caches, shared-memory copies; DUFU_THREAD_SANITIZER_TESTS
# in tests/CMakeLists.txt), so only those programs are built. The tokenizer tests'
# reference fixture is not needed there.
if [[ "${DUFU_TEST_TSAN:-1}" != 0 ]]; then
  next_phase "tsan build"
  cmake -S "$root" -B "$root/build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUFU_WERROR=ON \
    -DDUFU_SANITIZE_THREAD=ON -DDUFU_BUILD_BENCHMARKS=OFF
  cmake --build "$root/build-tsan" --target dufu_tests --parallel "$(nproc)"
  next_phase "tsan tests"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir "$root/build-tsan" --output-on-failure --timeout 900 -j "$(nproc)" -LE "slow|mpi" \
    -E "^fixture_bpe$"
fi

# libFuzzer (clang, ASan + UBSan): every parser of untrusted input for a bounded time.
if [[ "${DUFU_TEST_FUZZ:-1}" != 0 ]]; then
  next_phase "fuzz build and runs"
  DUFU_FUZZ_JOBS=2 "$root/scripts/fuzz.sh" "$root/build-fuzz" "${DUFU_TEST_FUZZ_SECONDS:-30}"
fi
