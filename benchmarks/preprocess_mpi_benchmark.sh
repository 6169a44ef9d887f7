#!/usr/bin/env bash
# The distributed preprocessing benchmark (issue 14): `dataprep preprocess` on the
# Linux kernel source as jsonl (the corpus and 32k BPE model of preprocess_benchmark.sh,
# shared through the same cache) under mpirun with 1 and 2 ranks of 1 worker each,
# against one process with 1 and 2 workers, in the same run. Goal: the MPI run within
# 10% of the threaded one at equal cores (rate ratio >= 0.90). Correctness first: the
# 2-rank output must equal the single process's byte for byte. Each configuration runs
# twice, in the order A B C D D C B A, and the rate is the mean of its two runs, so a
# drift of the machine's speed during the run weighs on every configuration alike.
# A program for humans: it prints a table with PASS/FAIL; nothing here runs as a test.
#
#   benchmarks/preprocess_mpi_benchmark.sh [BUILD_DIR]        (default: build-bench)
#
# Environment: DUFU_BENCH_WORK (corpus, model and outputs; default build-bench-work),
# DUFU_BENCH_MAX_BYTES (jsonl size, default 150000000), DUFU_BENCH_NO_BUILD=1 (use
# BUILD_DIR as is). Run it on an idle machine: the table shows how many cores other
# processes used meanwhile.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench_name=preprocess_mpi_benchmark
source "$root/benchmarks/bench_lib.sh"
build=${1:-$root/build-bench}
work=${DUFU_BENCH_WORK:-$root/build-bench-work}
max_bytes=${DUFU_BENCH_MAX_BYTES:-150000000}
goal_ratio=0.90
python=/usr/bin/python3
tarball=/usr/src/linux-source-6.1.tar.xz
mpirun=(mpirun --oversubscribe)
[[ $(id -u) == 0 ]] && mpirun+=(--allow-run-as-root)

[[ -x /usr/bin/time ]] || fail "/usr/bin/time not found. HINT: run scripts/setup.sh (Debian package time)"
command -v mpirun >/dev/null || fail "mpirun not found. HINT: run scripts/setup.sh (openmpi-bin)"
[[ -f $tarball ]] || fail "$tarball not found. HINT: run scripts/setup.sh (Debian package linux-source-6.1)"

bench_build "$root" "$build" dataprep
dataprep=$build/tools/dataprep/dataprep
[[ -x $dataprep ]] || fail "$dataprep missing"

# --- corpus and tokenizer (the same files and names as preprocess_benchmark.sh) ----
mkdir -p "$work"
name=kernel-$((max_bytes / 1000000))MB
jsonl=$work/$name.jsonl
model=$work/$name-bpe32k.model
if [[ ! -f $jsonl ]]; then
  echo "== corpus: $tarball -> $jsonl"
  "$python" "$root/scripts/corpus/kernel_source_to_jsonl.py" --tarball "$tarball" \
    --output "$jsonl" --max-bytes "$max_bytes"
fi
if [[ ! -f $model ]]; then
  echo "== tokenizer: 32k BPE on $jsonl"
  "$dataprep" train-tokenizer --input "$jsonl" --model-prefix "${model%.model}" \
    --vocab-size 32000 --model-type bpe --input-sentence-size 300000
fi
out=$work/mpi
mkdir -p "$out"
input_bytes=$(stat -c %s "$jsonl")

# --- correctness before timing -------------------------------------------------------
echo "== correctness: 2 ranks == 1 process on a 3000-document slice"
head -n 3000 "$jsonl" >"$out/slice.jsonl"
"$dataprep" preprocess -i "$out/slice.jsonl" -o "$out/slice-single" -m "$model" --append-eod -j 1 -q >/dev/null
"${mpirun[@]}" -np 2 "$dataprep" preprocess -i "$out/slice.jsonl" -o "$out/slice-np2" -m "$model" \
  --append-eod -j 1 -q >/dev/null 2>&1
{ cmp "$out/slice-single.bin" "$out/slice-np2.bin" && cmp "$out/slice-single.idx" "$out/slice-np2.idx"; } ||
  fail "2 ranks wrote a different shard than 1 process for $out/slice.jsonl"
echo "   ok: identical .bin and .idx"

# --- timing --------------------------------------------------------------------------
# One run: "LABEL seconds cpu_seconds peak_rss_MB others_cores". Every process (each
# rank) runs under /usr/bin/time, so CPU and RSS are per process, summed and maxed.
declare -A seconds_of cpu_of rss_of others_of
run_one() {  # LABEL RANKS WORKERS
  local label=$1 ranks=$2 workers=$3 prefix=$out/$1
  rm -f "$prefix".time.*
  local command=(sh -c '/usr/bin/time -v -o "$0.time.${OMPI_COMM_WORLD_RANK:-0}" "$@"' "$prefix"
    "$dataprep" preprocess -i "$jsonl" -o "$prefix" -m "$model" --append-eod -j "$workers" -q)
  [[ $ranks -gt 0 ]] && command=("${mpirun[@]}" -np "$ranks" "${command[@]}")
  echo "== $label: ${command[*]:0:6} ..."
  local b0 t0 t1
  b0=$(busy_ticks) t0=$(now)
  "${command[@]}" >"$prefix.summary" 2>"$prefix.log" || { cat "$prefix.log" >&2; fail "$label failed"; }
  t1=$(now)
  cmp "$prefix.bin" "$out/threads-w1.bin" 2>/dev/null || [[ $label == threads-w1 ]] ||
    fail "$label wrote a different .bin than threads-w1"
  local cpu rss
  cpu=$(cat "$prefix".time.* | awk -F': ' '/User time|System time/ { s += $2 } END { print s }')
  rss=$(cat "$prefix".time.* | awk -F': ' '/Maximum resident/ { if ($2 > m) m = $2 } END { printf "%.0f", m / 1024 }')
  local seconds others
  seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  others=$(others_cores "$b0" "$t0" "$cpu")
  sed 's/^/   /' "$prefix.summary" | head -1
  echo "   wall $seconds s, cpu $cpu s, peak rss $rss MB per process, others $others cores"
  seconds_of[$label]="${seconds_of[$label]:-} $seconds"
  cpu_of[$label]="${cpu_of[$label]:-} $cpu"
  rss_of[$label]=$rss
  others_of[$label]="${others_of[$label]:-} $others"
}
order=("threads-w1 0 1" "mpi-np1 1 1" "threads-w2 0 2" "mpi-np2 2 1")
for entry in "${order[@]}"; do run_one $entry; done
for ((i = ${#order[@]} - 1; i >= 0; i--)); do run_one ${order[$i]}; done

# --- report --------------------------------------------------------------------------
mean() { awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f", s / NF }' <<<"$1"; }
echo
echo "preprocess MPI benchmark: $name ($((input_bytes / 1000000)) MB of jsonl), model $(basename "$model"), $(nproc) cores"
printf "%-11s %5s %7s %8s %8s %10s %7s %6s\n" config cores seconds in_MB/s cpu_s MB/cpu_s rss_MB others
declare -A rate_of
for entry in "${order[@]}"; do
  read -r label ranks workers <<<"$entry"
  cores=$((ranks > 0 ? ranks * workers : workers))
  s=$(mean "${seconds_of[$label]}") c=$(mean "${cpu_of[$label]}") o=$(mean "${others_of[$label]}")
  rate_of[$label]=$(awk -v b="$input_bytes" -v s="$s" 'BEGIN { printf "%.3f", b / 1e6 / s }')
  printf "%-11s %5d %7.2f %8.2f %8.2f %10.2f %7s %6.2f\n" "$label" "$cores" "$s" "${rate_of[$label]}" "$c" \
    "$(awk -v b="$input_bytes" -v c="$c" 'BEGIN { print b / 1e6 / c }')" "${rss_of[$label]}" "$o"
done
# The goal is on wall-clock rates; the CPU seconds per byte say the same without the
# noise of other processes (their column "others"), which on a shared machine can
# move a wall-clock rate by 2x between two runs of one configuration.
status=0
for pair in "mpi-np1 threads-w1" "mpi-np2 threads-w2"; do
  read -r mpi threads <<<"$pair"
  ratio=$(awk -v a="${rate_of[$mpi]}" -v b="${rate_of[$threads]}" 'BEGIN { printf "%.3f", a / b }')
  cpu_ratio=$(awk -v a="$(mean "${cpu_of[$threads]}")" -v b="$(mean "${cpu_of[$mpi]}")" 'BEGIN { printf "%.3f", a / b }')
  verdict=$(awk -v r="$ratio" -v g="$goal_ratio" 'BEGIN { print (r >= g ? "PASS" : "FAIL") }')
  [[ $verdict == PASS ]] || status=1
  echo "$mpi / $threads: rate ratio $ratio (goal >= $goal_ratio) $verdict; MB per CPU second ratio $cpu_ratio"
done
exit $status
