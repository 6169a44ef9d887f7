# shellcheck shell=bash
# Helpers shared by the benchmark scripts; sourced, not run. The sourcing script sets
# bench_name (how its messages begin) before it calls fail.
#
#   source "$root/benchmarks/bench_lib.sh"

# fail MESSAGE...: prints "BENCH_NAME: MESSAGE" to stderr and exits 1.
fail() { echo "${bench_name:-benchmark}: $*" >&2; exit 1; }

# bench_build ROOT BUILD_DIR TARGET...: configures BUILD_DIR (Release, benchmarks on,
# tests off, Parquet input unless DUFU_PARQUET=OFF) when it has no CMakeCache.txt yet and builds the targets with every core.
# With DUFU_BENCH_NO_BUILD=1 it does nothing: BUILD_DIR is used as it is.
bench_build() {
  local root=$1 build=$2
  shift 2
  if [[ ${DUFU_BENCH_NO_BUILD:-0} == 1 ]]; then
    return 0
  fi
  echo "== build ($build)"
  if [[ ! -f $build/CMakeCache.txt ]]; then
    # Arrow's libraries for Parquet and Arrow input, as scripts/build.sh finds them.
    local arrow=(-DDUFU_PARQUET=OFF) arrow_python
    if [[ ${DUFU_PARQUET:-AUTO} != OFF ]] && arrow_python=$("$root/scripts/setup_arrow.sh" | tail -n 1); then
      arrow=(-DDUFU_ARROW_PYTHON="$arrow_python")
    fi
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDUFU_BUILD_TESTS=OFF -DDUFU_BUILD_BENCHMARKS=ON "${arrow[@]}" >/dev/null
  fi
  cmake --build "$build" --parallel "$(nproc)" --target "$@"
}

# --- how busy the machine was ------------------------------------------------------
# A timed command also reports how many cores OTHER processes kept busy meanwhile
# (busy CPU time from /proc/stat, steal included, minus the command's own): on a
# shared machine that, not dufu, is the usual reason for a surprising rate.
ticks_per_second=$(getconf CLK_TCK)
busy_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
now() { date +%s.%N; }
# others_cores BUSY_TICKS_BEFORE START_TIME OWN_CPU_SECONDS
others_cores() {
  awk -v b0="$1" -v b1="$(busy_ticks)" -v t0="$2" -v t1="$(now)" -v own="$3" -v hz="$ticks_per_second" \
    'BEGIN { o = ((b1 - b0) / hz - own) / (t1 - t0); printf "%.2f", o < 0 ? 0 : o }'
}
# own_cpu TIME_REPORT: user + system seconds of a /usr/bin/time -v report.
own_cpu() { awk -F': ' '/User time|System time/ { s += $2 } END { print s }' "$1"; }
# field KEY LINE: the value of " KEY=VALUE" in LINE.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

# --- the fortunes shard the mpirun training benchmarks share ------------------------
# mpi_training_setup ROOT BUILD_DIR WORK_DIR: checks mpirun, builds dataprep and train
# (bench_build), sets `dataprep`, `train` and the array `mpirun` (as root, oversubscribed),
# and makes WORK_DIR/fortunes.{bin,idx}: Debian's fortunes tokenized with an 8k BPE
# trained on them (once; later runs reuse it).
mpi_training_setup() {
  local root=$1 build=$2 work=$3
  command -v mpirun >/dev/null || fail "mpirun not found. HINT: run scripts/setup.sh (openmpi-bin)"
  mpirun=(mpirun --allow-run-as-root --oversubscribe)
  bench_build "$root" "$build" dataprep train
  dataprep=$build/tools/dataprep/dataprep
  train=$build/tools/train/train
  [[ -x $dataprep && -x $train ]] || fail "$dataprep or $train missing"
  mkdir -p "$work"
  if [[ ! -f $work/fortunes.idx ]]; then
    echo "== data: fortunes -> $work/fortunes"
    /usr/bin/python3 "$root/scripts/corpus/fortunes_to_jsonl.py" > "$work/fortunes.jsonl"
    "$dataprep" train-tokenizer --input "$work/fortunes.jsonl" --model-prefix "$work/tokenizer" \
      --vocab-size 8000 --model-type bpe >/dev/null
    "$dataprep" preprocess -q --input "$work/fortunes.jsonl" --output-prefix "$work/fortunes" \
      --tokenizer-model "$work/tokenizer.model" --append-eod
  fi
}
