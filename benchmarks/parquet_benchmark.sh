#!/usr/bin/env bash
# The Parquet input benchmark (issue 41): `dataprep preprocess` of a corpus as Parquet
# against the same documents as jsonl, in the same run, with 2 workers (or
# DUFU_BENCH_WORKERS). The corpus is Debian's Linux kernel source as jsonl (the
# preprocess benchmark's, scripts/corpus/kernel_source_to_jsonl.py), written to Parquet
# by pyarrow as datatrove writes FineWeb (snappy, a row group per 1000 documents, text +
# id + url columns), a row group also ending at 32 MiB of text (Arrow's reader holds
# a few times the largest row group's text column: the kernel's generated headers put
# 142 MB of text in some 1000-document groups, where FineWeb's hold a few MB). Runs jsonl, Parquet, jsonl (the jsonl rate is the mean of the two
# around the Parquet run, since a VM's core speed drifts); checks the two outputs are
# byte-identical; prints rates, peak RSS (/usr/bin/time -v) and the ratio.
# Goal: Parquet rate >= 0.9 x jsonl's, peak RSS < 500 MB. A program for humans, not a
# test. About 10 minutes on 2 cores at the default 1 GB (plus the corpus, tokenizer and
# Parquet file the first time).
#
#   benchmarks/parquet_benchmark.sh [BUILD_DIR]        (default: build-bench)
#
# Environment: DUFU_BENCH_WORK (default build-bench-work), DUFU_BENCH_MAX_BYTES (jsonl
# size, default 1000000000), DUFU_BENCH_COPIES (the corpus repeated, default 1: the
# kernel source's 742 MB of documents make 208 MB of Parquet, 5 copies a 1 GB file),
# DUFU_BENCH_WORKERS (default 2), DUFU_BENCH_NO_BUILD=1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench_name=parquet_benchmark
source "$root/benchmarks/bench_lib.sh"
build=${1:-$root/build-bench}
work=${DUFU_BENCH_WORK:-$root/build-bench-work}
max_bytes=${DUFU_BENCH_MAX_BYTES:-1000000000}
workers=${DUFU_BENCH_WORKERS:-2}
copies=${DUFU_BENCH_COPIES:-1}
goal_ratio=0.9
goal_rss_mb=500
tarball=/usr/src/linux-source-6.1.tar.xz

[[ -x /usr/bin/time ]] || fail "/usr/bin/time not found. HINT: run scripts/setup.sh (Debian package time)"
[[ -f $tarball ]] || fail "$tarball not found. HINT: run scripts/setup.sh (Debian package linux-source-6.1)"
arrow_python=$("$root/scripts/setup_arrow.sh" | tail -n 1) || fail "scripts/setup_arrow.sh failed"

bench_build "$root" "$build" dataprep
dataprep=$build/tools/dataprep/dataprep
[[ -x $dataprep ]] || fail "$dataprep missing"

mkdir -p "$work"
name=kernel-$((max_bytes / 1000000))MB
source_jsonl=$work/$name.jsonl
# Documents of at most 4 MiB: the kernel source has a few generated register headers
# of over 16 MiB (preprocess's default --max-document-bytes), which web corpora do not.
documents_jsonl=$work/$name-under-4MiB.jsonl
copies_name=$name-under-4MiB$( ((copies > 1)) && echo "-x$copies")
jsonl=$work/$copies_name.jsonl
parquet=$work/$copies_name-groups-1000-or-32MiB.parquet
model_prefix=$work/$name-under-4MiB-bpe32k
if [[ ! -f $source_jsonl ]]; then
  echo "== corpus: $tarball -> $source_jsonl"
  /usr/bin/python3 "$root/scripts/corpus/kernel_source_to_jsonl.py" --tarball "$tarball" \
    --output "$source_jsonl" --max-bytes "$max_bytes"
fi
if [[ ! -f $documents_jsonl ]]; then
  LC_ALL=C awk 'length($0) <= 4194304' "$source_jsonl" >"$documents_jsonl.partial"
  mv "$documents_jsonl.partial" "$documents_jsonl"
fi
if [[ ! -f $jsonl ]]; then
  for ((i = 0; i < copies; ++i)); do cat "$documents_jsonl"; done >"$jsonl.partial"
  mv "$jsonl.partial" "$jsonl"
fi
if [[ ! -f $model_prefix.model ]]; then
  echo "== tokenizer: 32k BPE on $jsonl"
  "$dataprep" train-tokenizer --input "$documents_jsonl" --model-prefix "$model_prefix" \
    --vocab-size 32000 --model-type bpe --input-sentence-size 300000
fi
if [[ ! -f $parquet ]]; then
  echo "== corpus: $jsonl -> $parquet (pyarrow, snappy, row groups of 1000 documents or 32 MiB)"
  "$arrow_python" - "$jsonl" "$parquet.partial" <<'PY'
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
source, target = sys.argv[1:]
schema = pa.schema([("text", pa.string()), ("id", pa.string()), ("url", pa.string())])
with pq.ParquetWriter(target, schema, compression="snappy") as writer:
    rows, n, size = [], 0, 0
    def flush():
        writer.write_table(pa.table({"text": rows, "id": [f"<urn:{n - len(rows) + i}>" for i in range(len(rows))],
                                     "url": [f"file:{n - len(rows) + i}" for i in range(len(rows))]}, schema=schema))
    for line in open(source, encoding="utf-8"):
        rows.append(json.loads(line)["text"])
        n += 1
        size += len(rows[-1].encode())
        if len(rows) == 1000 or size >= 32 << 20:
            flush()
            rows, size = [], 0
    if rows:
        flush()
PY
  mv "$parquet.partial" "$parquet"
fi
out=$work/parquet-out
mkdir -p "$out"

declare -a rows=()
run_one() {  # INPUT LABEL
  local prefix=$out/$2
  echo "== dataprep preprocess $2 --workers $workers"
  local b0 t0
  b0=$(busy_ticks) t0=$(now)
  /usr/bin/time -v -o "$prefix.time" "$dataprep" preprocess --input "$1" --output-prefix "$prefix" \
    --tokenizer-model "$model_prefix.model" --append-eod --workers "$workers" --quiet >"$prefix.summary"
  local others seconds rss_kb
  others=$(others_cores "$b0" "$t0" "$(own_cpu "$prefix.time")")
  sed 's/^/   /' "$prefix.summary"
  seconds=$(sed -n 's/^preprocess: done in \([0-9.]*\) s.*/\1/p' "$prefix.summary")
  rss_kb=$(sed -n 's/^\tMaximum resident set size (kbytes): //p' "$prefix.time")
  [[ -n $seconds && -n $rss_kb ]] || fail "cannot parse $prefix.summary or $prefix.time"
  rows+=("$2 $seconds $rss_kb $(stat -c %s "$1") $others")
}
run_one "$jsonl" jsonl-before
run_one "$parquet" parquet
run_one "$jsonl" jsonl-after
for label in parquet jsonl-after; do
  { cmp "$out/jsonl-before.bin" "$out/$label.bin" && cmp "$out/jsonl-before.idx" "$out/$label.idx"; } ||
    fail "$label wrote other bytes than jsonl-before"
done
echo "   ok: the Parquet and jsonl outputs are byte-identical"

echo
echo "parquet benchmark: $name ($(stat -c %s "$jsonl") bytes of jsonl, $(stat -c %s "$parquet") of Parquet)," \
  "$workers workers, $(nproc) cores"
printf '%s\n' "${rows[@]}" | awk -v goal="$goal_ratio" -v goal_rss="$goal_rss_mb" '
  { label[NR] = $1; sec[NR] = $2; rss[NR] = $3 * 1024 / 1e6; bytes[NR] = $4; others[NR] = $5 }
  END {
    printf "%-13s %8s %8s %8s %7s\n", "input", "seconds", "docs_MB", "rss_MB", "others"
    for (i = 1; i <= NR; i++) printf "%-13s %8.1f %8.0f %8.0f %7.2f\n", label[i], sec[i], bytes[i] / 1e6, rss[i], others[i]
    # The same documents: the rate of each is the same work over its seconds.
    ratio = (sec[1] + sec[3]) / 2 / sec[2]
    ok = ratio >= goal && rss[2] < goal_rss
    printf "Parquet / jsonl rate (same documents, jsonl the mean of the runs around it): %.3f (goal >= %.1f); Parquet peak RSS %.0f MB (goal < %d): %s\n",
      ratio, goal, rss[2], goal_rss, ok ? "PASS" : "FAIL"
    exit !ok
  }'
