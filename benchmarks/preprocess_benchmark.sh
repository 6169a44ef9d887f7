#!/usr/bin/env bash
# The preprocessing benchmark: `dataprep preprocess` on a real corpus (Debian's Linux
# kernel source, ~150 MB of jsonl, plain and .zst) with --workers 1 and all cores,
# against sentencepiece's single-thread encode rate on the same text measured in the
# same run (the tokenizer-bound limit). Goal: text MB/s >= 0.85 x workers x that rate,
# peak RSS < 500 MB. A program for humans: it checks correctness first, then prints
# a table with PASS/FAIL; nothing here runs as a test. About 10 minutes on 2 cores
# (5 baselines + 4 runs), plus ~2 minutes the first time to build corpus and model.
#
#   benchmarks/preprocess_benchmark.sh [BUILD_DIR]        (default: build-bench)
#
# Environment: DUFU_BENCH_WORK (corpus, model and outputs; default build-bench-work),
# DUFU_BENCH_MAX_BYTES (jsonl size, default 150000000), DUFU_BENCH_WORKERS (the
# "all cores" worker count, default nproc), DUFU_BENCH_NO_BUILD=1 (use BUILD_DIR as is).
# Run it on an idle machine: the table shows how many cores other processes used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench_name=preprocess_benchmark
source "$root/benchmarks/bench_lib.sh"
build=${1:-$root/build-bench}
work=${DUFU_BENCH_WORK:-$root/build-bench-work}
max_bytes=${DUFU_BENCH_MAX_BYTES:-150000000}
all_workers=${DUFU_BENCH_WORKERS:-$(nproc)}
goal_ratio=0.85
goal_rss_mb=500
python=/usr/bin/python3
tarball=/usr/src/linux-source-6.1.tar.xz

# --- prerequisites -------------------------------------------------------------
[[ -x /usr/bin/time ]] || fail "/usr/bin/time not found (it measures peak RSS). HINT: run scripts/setup.sh (Debian package time)"
command -v zstd >/dev/null || fail "zstd not found. HINT: run scripts/setup.sh"
[[ -f $tarball ]] || fail "$tarball not found. HINT: run scripts/setup.sh (Debian package linux-source-6.1)"
"$python" -c "import sentencepiece" 2>/dev/null ||
  fail "$python cannot import sentencepiece. HINT: run scripts/setup.sh (python3-sentencepiece)"

# --- build ---------------------------------------------------------------------
bench_build "$root" "$build" dataprep spm_encode_rate
dataprep=$build/tools/dataprep/dataprep
spm_encode_rate=$build/benchmarks/spm_encode_rate
[[ -x $dataprep && -x $spm_encode_rate ]] ||
  fail "$dataprep or $spm_encode_rate missing. HINT: build with -DDUFU_BUILD_BENCHMARKS=ON"

# --- corpus and tokenizer (cached; names carry what they were made from) --------
mkdir -p "$work"
name=kernel-$((max_bytes / 1000000))MB
jsonl=$work/$name.jsonl
model_prefix=$work/$name-bpe32k
if [[ ! -f $jsonl ]]; then
  echo "== corpus: $tarball -> $jsonl"
  "$python" "$root/scripts/corpus/kernel_source_to_jsonl.py" --tarball "$tarball" \
    --output "$jsonl" --max-bytes "$max_bytes"
fi
if [[ ! -f $jsonl.zst ]]; then
  echo "== corpus: $jsonl.zst"
  zstd -q -T0 -o "$jsonl.zst.partial" "$jsonl" && mv "$jsonl.zst.partial" "$jsonl.zst"
fi
if [[ ! -f $model_prefix.model ]]; then
  echo "== tokenizer: 32k BPE on $jsonl"
  "$dataprep" train-tokenizer --input "$jsonl" --model-prefix "$model_prefix" \
    --vocab-size 32000 --model-type bpe --input-sentence-size 300000
fi
model=$model_prefix.model
out=$work/out
mkdir -p "$out"

# --- correctness before timing ---------------------------------------------------
# On a slice with small batches (many batches in flight, reordered by the writer):
# --workers 1 and --workers N must write identical bytes, and the .bin must equal
# sentencepiece's own Python encoding of each document followed by </s> (uint16: the
# 32k vocabulary is below Megatron's 65500 threshold).
echo "== correctness on a 1000-document slice"
head -n 1000 "$jsonl" >"$out/slice.jsonl"
for w in 1 "$all_workers"; do
  "$dataprep" preprocess --input "$out/slice.jsonl" --output-prefix "$out/slice-w$w" \
    --tokenizer-model "$model" --append-eod --workers "$w" --batch-bytes 65536 --quiet >/dev/null
done
{ cmp "$out/slice-w1.bin" "$out/slice-w$all_workers.bin" &&
  cmp "$out/slice-w1.idx" "$out/slice-w$all_workers.idx"; } ||
  fail "--workers 1 and --workers $all_workers wrote different shards for $out/slice.jsonl"
"$python" - "$model" "$out/slice.jsonl" "$out/slice-w1.bin" <<'EOF'
import array, json, sys
import sentencepiece as spm
model, jsonl, binary = sys.argv[1:]
sp = spm.SentencePieceProcessor(model_file=model)
expected = array.array("H")
for line in open(jsonl, encoding="utf-8"):
    ids = sp.encode(json.loads(line)["text"])
    if ids:
        expected.extend(ids + [sp.eos_id()])
if sys.byteorder != "little":
    expected.byteswap()
if expected.tobytes() != open(binary, "rb").read():
    sys.exit(f"preprocess_benchmark: {binary} differs from sentencepiece's Python encoding")
print(f"   ok: workers 1 == workers N, and {len(expected)} tokens == sentencepiece (Python)")
EOF

# --- timing ----------------------------------------------------------------------
# The baseline is measured before every dataprep run and once after the last; each run
# is compared with the mean of the two baselines around it, because on a VM the speed
# of a core drifts by 10% or more within minutes. Every timed command also reports
# how many cores OTHER processes kept busy meanwhile (busy CPU time from /proc/stat,
# steal included, minus the command's own): on a shared machine that, not dufu, is
# the usual reason for a low ratio (others_cores, in bench_lib.sh).

# Appends "spm_encode_rate ... others=CORES" to baselines.
declare -a baselines=()
measure_baseline() {
  echo "== baseline: sentencepiece single-thread Encode on $jsonl"
  local line b0 t0
  b0=$(busy_ticks) t0=$(now)
  line=$(/usr/bin/time -v -o "$out/baseline.time" "$spm_encode_rate" --tokenizer-model "$model" --input "$jsonl")
  line="$line others=$(others_cores "$b0" "$t0" "$(own_cpu "$out/baseline.time")")"
  echo "   $line"
  baselines+=("$line")
}

# One dataprep run under /usr/bin/time -v; checks its counts against the baseline and
# appends "label workers seconds input_bytes documents tokens rss_kb cpu others" to runs.
declare -a runs=()
run_one() {  # INPUT_FILE LABEL WORKERS
  local input=$1 label=$2 w=$3 prefix=$out/$2-w$3
  local base=${baselines[0]}
  local base_docs base_empty base_tokens base_text
  base_docs=$(field documents "$base") base_empty=$(field empty "$base")
  base_tokens=$(field tokens "$base") base_text=$(field text_bytes "$base")
  echo "== dataprep preprocess $label --workers $w"
  local b0 t0 others
  b0=$(busy_ticks) t0=$(now)
  /usr/bin/time -v -o "$prefix.time" "$dataprep" preprocess --input "$input" \
    --output-prefix "$prefix" --tokenizer-model "$model" --append-eod --workers "$w" \
    --quiet >"$prefix.summary"
  others=$(others_cores "$b0" "$t0" "$(own_cpu "$prefix.time")")
  sed 's/^/   /' "$prefix.summary"
  local seconds docs tokens empty text_mb rss_kb cpu
  seconds=$(sed -n 's/^preprocess: done in \([0-9.]*\) s.*/\1/p' "$prefix.summary")
  docs=$(sed -n 's/^  documents  \([0-9]*\) written, \([0-9]*\) empty.*/\1/p' "$prefix.summary")
  empty=$(sed -n 's/^  documents  \([0-9]*\) written, \([0-9]*\) empty.*/\2/p' "$prefix.summary")
  tokens=$(sed -n 's/^  tokens     \([0-9]*\) .*/\1/p' "$prefix.summary")
  # The summary rounds sizes to 3 significant digits: its text size is only a cross-
  # check; the rates use the exact byte count from the baseline (same documents).
  text_mb=$(sed -n 's/^  input .*; text \([0-9.]*\) \([kMG]*\)B$/\1 \2/p' "$prefix.summary" |
    awk '{ print $1 * ($2 == "k" ? 1e-3 : $2 == "M" ? 1 : $2 == "G" ? 1e3 : 1e-6) }')
  rss_kb=$(sed -n 's/^\tMaximum resident set size (kbytes): //p' "$prefix.time")
  cpu=$(sed -n 's/^\tPercent of CPU this job got: //p' "$prefix.time")
  [[ -n $seconds && -n $docs && -n $tokens && -n $text_mb && -n $rss_kb && -n $cpu ]] ||
    fail "cannot parse $prefix.summary or $prefix.time"
  # Same text as the baseline: same documents, and every non-empty one gets one </s>.
  [[ $docs == "$base_docs" && $empty == "$base_empty" ]] ||
    fail "$label: $docs documents ($empty empty), sentencepiece: $base_docs ($base_empty empty)"
  [[ $tokens == $((base_tokens + base_docs)) ]] ||
    fail "$label: $tokens tokens, expected sentencepiece's $base_tokens + $base_docs </s>"
  awk -v t="$text_mb" -v b="$base_text" 'BEGIN { r = t * 1e6 / b; exit !(r > 0.994 && r < 1.006) }' ||
    fail "$label: summary says text $text_mb MB, sentencepiece read $base_text bytes"
  runs+=("$label $w $seconds $(stat -c %s "$input") $docs $tokens $rss_kb $cpu $others")
}

for input in "$jsonl" "$jsonl.zst"; do
  for w in 1 "$all_workers"; do
    measure_baseline
    run_one "$input" "${input##*/"$name".}" "$w"
  done
done
measure_baseline

# Output bytes must not depend on the worker count or the compression of the input.
for run in jsonl-w"$all_workers" jsonl.zst-w1 jsonl.zst-w"$all_workers"; do
  { cmp "$out/jsonl-w1.bin" "$out/$run.bin" && cmp "$out/jsonl-w1.idx" "$out/$run.idx"; } ||
    fail "$run output differs from jsonl-w1"
done

# --- report ----------------------------------------------------------------------
first=${baselines[0]}
echo
echo "preprocess benchmark: $name: $(awk -v b="$(field text_bytes "$first")" 'BEGIN { printf "%.1f", b / 1e6 }')" \
  "MB of text, $(field documents "$first") documents," \
  "$(($(field tokens "$first") + $(field documents "$first"))) tokens; $(nproc) cores;" \
  "model $(basename "$model")"
for line in "${baselines[@]}"; do
  echo "baseline (sentencepiece single-thread Encode): $(field text_mb_per_s "$line") MB/s," \
    "$(field tokens_per_s "$line") tokens/s; others $(field others "$line") cores"
done
# Each run row, then its two bracketing baselines: "MB/s others MB/s others".
for i in "${!runs[@]}"; do
  before=${baselines[$i]} after=${baselines[$((i + 1))]}
  echo "${runs[$i]} $(field text_mb_per_s "$before") $(field others "$before")" \
    "$(field text_mb_per_s "$after") $(field others "$after")"
done | awk -v text_bytes="$(field text_bytes "$first")" -v goal="$goal_ratio" \
  -v goal_rss="$goal_rss_mb" '
  BEGIN {
    printf "%-10s %7s %7s %5s %8s %9s %8s %9s %7s %6s %7s %6s  %s\n", "input", "workers", "seconds",
      "cpu", "in_MB/s", "text_MB/s", "docs/s", "tokens/s", "rss_MB", "others", "base", "ratio", "goal"
  }
  {
    s = $3; text_rate = text_bytes / 1e6 / s; rss_mb = $7 * 1024 / 1e6
    base = ($10 + $12) / 2; ratio = text_rate / ($2 * base)
    ok = (ratio >= goal && rss_mb < goal_rss) ? "PASS" : "FAIL"
    if (ok == "FAIL") failed = 1
    if ($9 > 0.1 || $11 > 0.1 || $13 > 0.1) busy = 1
    d = $10 > $12 ? $10 / $12 : $12 / $10
    if (d > drift) drift = d
    printf "%-10s %7d %7.1f %5s %8.2f %9.2f %8.0f %9.0f %7.0f %6.2f %7.3f %6.3f  %s\n", $1, $2, s,
      $8, $4 / 1e6 / s, text_rate, $5 / s, $6 / s, rss_mb, $9, base, ratio, ok
  }
  END {
    print "cpu: cores the run used (time -v); others: cores other processes kept busy meanwhile;"
    print "base: mean of the baselines just before and after the run, MB/s of text;"
    printf "ratio = text MB/s / (workers x base); goal: ratio >= %s and peak RSS < %s MB\n", goal, goal_rss
    if (busy) print "WARNING: other processes competed for the cores (others > 0.1): the rates " \
      "and ratios are skewed; rerun on an idle machine"
    if (drift > 1.05) printf "WARNING: consecutive baselines differ by up to %.0f%%: the core " \
      "speed drifted, the ratios are uncertain by about as much\n", (drift - 1) * 100
    print "outputs: all 4 runs byte-identical, token counts == sentencepiece + one </s> per document"
    print (failed ? "verdict: FAIL" : "verdict: PASS")
  }'
