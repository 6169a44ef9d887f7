# shellcheck shell=bash
# Helpers shared by the benchmark scripts; sourced, not run. The sourcing script sets
# bench_name (how its messages begin) before it calls fail.
#
#   source "$root/benchmarks/bench_lib.sh"

# fail MESSAGE...: prints "BENCH_NAME: MESSAGE" to stderr and exits 1.
fail() { echo "${bench_name:-benchmark}: $*" >&2; exit 1; }

# bench_build ROOT BUILD_DIR TARGET...: configures BUILD_DIR (Release, benchmarks on,
# tests off) when it has no CMakeCache.txt yet and builds the targets with every core.
# With DUFU_BENCH_NO_BUILD=1 it does nothing: BUILD_DIR is used as it is.
bench_build() {
  local root=$1 build=$2
  shift 2
  if [[ ${DUFU_BENCH_NO_BUILD:-0} == 1 ]]; then
    return 0
  fi
  echo "== build ($build)"
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDUFU_BUILD_TESTS=OFF -DDUFU_BUILD_BENCHMARKS=ON >/dev/null
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
