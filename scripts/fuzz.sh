#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (DUFU_FUZZ=ON: ASan + UBSan) and
# runs every one for a bounded time, a few at a time; fails if any target finds a
# crash, a leak, a timeout, an out-of-memory or a broken promise.
#
#   scripts/fuzz.sh [BUILD_DIR [SECONDS]]     (defaults: build-fuzz, 60 s per target)
#
# Environment: DUFU_FUZZ_JOBS targets at once (default 2), DUFU_FUZZ_TARGETS a
# space-separated subset (e.g. "npy safetensors"), DUFU_FUZZ_BUILD=0 to use the
# build as it is. Each target starts from its seeds (fuzz/corpus/NAME, never written)
# and the corpus its earlier runs grew in BUILD_DIR/fuzz/corpus/NAME. A finding is
# saved as BUILD_DIR/fuzz/findings/NAME-crash-... (reproduce: BINARY FILE) and its
# log is printed; make it a regression test (docs/install.md, "Sanitizers and fuzzing").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$(realpath -m "${1:-$root/build-fuzz}")
seconds=${2:-60}
jobs=${DUFU_FUZZ_JOBS:-2}

if [[ "${DUFU_FUZZ_BUILD:-1}" != 0 ]]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDUFU_WERROR=ON -DDUFU_FUZZ=ON -DDUFU_BUILD_TESTS=OFF -DDUFU_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build_dir" --target fuzzers --parallel "$(nproc)"
fi

# Lines of "target binary seeds", written by fuzz/CMakeLists.txt.
mapfile -t lines <"$build_dir/fuzz/fuzzers.txt"
selected=()
for line in "${lines[@]}"; do
  read -r target _ _ <<<"$line"
  if [[ -z "${DUFU_FUZZ_TARGETS:-}" || " $DUFU_FUZZ_TARGETS " == *" ${target%_fuzzer} "* ]]; then
    selected+=("$line")
  fi
done
if ((${#selected[@]} == 0)); then
  echo "fuzz: no target matches DUFU_FUZZ_TARGETS='${DUFU_FUZZ_TARGETS:-}'" >&2
  exit 1
fi

# The targets write their inputs to files: on tmpfs when there is one, and in a
# directory of this run's own, removed at the end even after a crash.
scratch_parent=/dev/shm
[[ -d $scratch_parent && -w $scratch_parent ]] || scratch_parent=$build_dir/fuzz
scratch=$(mktemp -d "$scratch_parent/dufu-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$build_dir/fuzz/logs" "$build_dir/fuzz/findings"

# run_target LINE: fuzzes one target for $seconds; its summary goes to logs/NAME.summary.
run_target() {
  local target binary seeds name corpus log start elapsed status
  read -r target binary seeds <<<"$1"
  name=${target%_fuzzer}
  corpus=$build_dir/fuzz/corpus/$name
  log=$build_dir/fuzz/logs/$name.log
  mkdir -p "$corpus"
  start=$(date +%s)
  status=0
  # -timeout: one input running 30 s is a finding; -rss_limit_mb (also the malloc
  # limit): so is one needing 2 GB.
  TMPDIR=$scratch "$binary" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build_dir/fuzz/findings/$name-" \
    "$corpus" "$seeds" >"$log" 2>&1 || status=$?
  elapsed=$(($(date +%s) - start))
  local executions corpus_size
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  corpus_size=$(find "$corpus" -type f | wc -l)
  printf '%s %s %s %s %s\n' "$name" "$status" "$elapsed" "${executions:-?}" "$corpus_size" \
    >"$build_dir/fuzz/logs/$name.summary"
}

echo "fuzz: ${#selected[@]} targets, ${seconds} s each, $jobs at a time"
rm -f "$build_dir"/fuzz/logs/*.summary
running=0
for line in "${selected[@]}"; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  run_target "$line" &
  running=$((running + 1))
done
wait || true

failed=0
printf '%-20s %8s %12s %10s %8s  %s\n' target seconds executions exec/s corpus result
for line in "${selected[@]}"; do
  read -r target _ _ <<<"$line"
  name=${target%_fuzzer}
  summary=$build_dir/fuzz/logs/$name.summary
  if [[ ! -f $summary ]]; then
    echo "fuzz: $name did not report" >&2
    failed=1
    continue
  fi
  read -r _ status elapsed executions corpus_size <"$summary"
  rate='?'
  [[ $executions =~ ^[0-9]+$ ]] && ((elapsed > 0)) && rate=$((executions / elapsed))
  result=ok
  ((status == 0)) || result="FAILED (exit $status)"
  printf '%-20s %8s %12s %10s %8s  %s\n' "$name" "$elapsed" "$executions" "$rate" "$corpus_size" "$result"
  if ((status != 0)); then
    failed=1
    echo "---- $build_dir/fuzz/logs/$name.log (last 60 lines)" >&2
    tail -n 60 "$build_dir/fuzz/logs/$name.log" >&2
  fi
done
if ((failed)); then
  echo "fuzz: FAILED; inputs in $build_dir/fuzz/findings/ (reproduce: BINARY FILE)" >&2
  exit 1
fi
echo "fuzz: no findings"
