#!/usr/bin/env bash
# The tokenizer benchmark: dufu's single-thread encode rate (MB/s of text per core,
# in thread CPU time) against the reference encoders measured in the same run on the
# same text, token for token (the id checksums must match): tiktoken's
# encode_ordinary, bpe-openai, quicktok and HuggingFace tokenizers (a tokenizer.json
# made from the rank file; for cl100k/o200k) and sentencepiece's Encode. Corpora from
# Debian packages: kernel code (arch/x86), kernel prose (Documentation/) and translated
# manual pages (de, ru, ja, zh; 3 MB of each). Then end to end against tiktoken:
# `dataprep preprocess` with one worker, o200k and cl100k, on each corpus. Then
# `dataprep preprocess` with 1 and 2 workers, with o200k and with the 32k sentencepiece
# BPE models on the kernel code, MB/s and peak RSS. Two 32k sentencepiece BPE models are
# trained on the kernel code: spm-bpe32k with the default normalizer (nmt_nfkc, dufu's
# word cache) and spm-llama32k with Llama 2's settings (identity normalizer, extra
# whitespace kept, whitespace-only pieces, split digits, byte fallback: dufu's cut
# path). A program for humans; nothing here runs as a test. About 10-15 minutes on 2
# cores, plus the corpora and the 32k models the first time (spm-llama32k: 2.5 minutes
# wall at load 10-14).
#
#   benchmarks/tokenizer_benchmark.sh [BUILD_DIR]     (default: build-bench)
#
# Environment: DUFU_BENCH_WORK (corpora, model, outputs; default build-bench-work),
# DUFU_BENCH_NO_BUILD=1 (use BUILD_DIR as it is), DUFU_BENCH_CODE_BYTES (default 16 MB),
# DUFU_BENCH_ONLY="TOKENIZER:CORPUS ..." (only those rows, e.g. "cl100k:i18n"; no end to end).
# dufu is measured twice: "cold", a fresh encoder per pass as a preprocess worker
# starts, and "warm", the encoder's caches already full of this corpus (a long run's
# steady state on text like it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench_name=tokenizer_benchmark
source "$root/benchmarks/bench_lib.sh"
build=${1:-$root/build-bench}
work=${DUFU_BENCH_WORK:-$root/build-bench-work}
code_bytes=${DUFU_BENCH_CODE_BYTES:-16000000}
only=${DUFU_BENCH_ONLY:-}
[[ -x /usr/bin/time ]] || fail "/usr/bin/time not found. HINT: run scripts/setup.sh"

bench_build "$root" "$build" dataprep tokenizer_benchmark
dataprep=$build/tools/dataprep/dataprep
encode=$build/benchmarks/tokenizer_benchmark
python=$("$root/scripts/setup_reference_venv.sh" | tail -n 1)
ranks=$(dirname "$(dirname "$python")")/rank-files
reference="$root/benchmarks/reference/tokenizer_reference_rate.py"

# --- corpora and the 32k model (cached) ---------------------------------------------
mkdir -p "$work"
code=$work/tok-code.jsonl prose=$work/tok-prose.jsonl i18n=$work/tok-i18n.jsonl
if [[ ! -f $code ]]; then
  /usr/bin/python3 "$root/scripts/corpus/kernel_source_to_jsonl.py" --output "$code" \
    --path-prefix arch/x86/ --suffixes .c,.h,.S --max-bytes "$code_bytes" --allow-fewer
fi
if [[ ! -f $prose ]]; then
  /usr/bin/python3 "$root/scripts/corpus/kernel_source_to_jsonl.py" --output "$prose" \
    --path-prefix Documentation/ --suffixes .rst,.txt --max-bytes 12000000 --allow-fewer
fi
if [[ ! -f $i18n ]]; then
  "$python" -c '
import sys
sys.path.insert(0, sys.argv[1])
import tokenizer_reference as t
t.write_jsonl(sys.argv[2], t.manual_pages(3000000))' "$root/tests/reference" "$i18n"
fi
spm=$work/tok-code-bpe32k
if [[ ! -f $spm.model && ( -z $only || $only == *spm-bpe32k* ) ]]; then
  echo "== tokenizer: 32k sentencepiece BPE on $code"
  "$dataprep" train-tokenizer --input "$code" --model-prefix "$spm" --vocab-size 32000 --model-type bpe \
    --input-sentence-size 300000 >/dev/null
fi

spm_llama=$work/tok-code-bpe32k-llama
if [[ ! -f $spm_llama.model && ( -z $only || $only == *spm-llama* ) ]]; then
  echo "== tokenizer: 32k sentencepiece BPE with Llama 2's settings on $code"
  start=$(now)
  "$dataprep" train-tokenizer --input "$code" --model-prefix "$spm_llama" --vocab-size 32000 --model-type bpe \
    --input-sentence-size 300000 --spm-arg=--normalization_rule_name=identity \
    --spm-arg=--remove_extra_whitespaces=false --spm-arg=--allow_whitespace_only_pieces=true \
    --spm-arg=--byte_fallback=true --spm-arg=--split_digits=true --spm-arg=--add_dummy_prefix=true >/dev/null
  echo "== trained in $(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }') s"
fi

# --- single-thread rates --------------------------------------------------------------
results=$work/tok-results.txt
: >"$results"
printf '%-10s %-6s %10s %10s   %-14s %10s %8s %8s  %s\n' tokenizer corpus "dufu cold" "dufu warm" reference \
  "ref MB/s" "cold/ref" "warm/ref" tokens | tee -a "$results"
measure() {  # measure NAME CORPUS_NAME CORPUS KIND MODEL [PATTERN]
  local name=$1 corpus_name=$2 corpus=$3 kind=$4 model=$5 pattern=${6:-}
  if [[ -n $only && " $only " != *" $name:$corpus_name "* ]]; then return 0; fi
  local dufu_flags=() ref_flags=()
  if [[ -n $pattern ]]; then
    dufu_flags=(--tokenizer-pattern "$pattern")
    ref_flags=(--pattern "$pattern")
  fi
  local cold warm
  cold=$("$encode" -m "$model" -i "$corpus" "${dufu_flags[@]}")
  warm=$("$encode" -m "$model" -i "$corpus" --warm "${dufu_flags[@]}")
  local checksum
  checksum=$(field checksum "$cold")
  local refs
  if [[ $kind == spm ]]; then
    # The reference's checksum is its own: sentencepiece's Encode of each whole document.
    refs="reference sentencepiece-c++ $("$encode" -m "$model" -i "$corpus" --uncached)"
  else
    refs=$("$python" "$reference" "$kind" "$model" "$corpus" "${ref_flags[@]}" --hf-cache "$work" 2>/dev/null)
  fi
  while read -r _ ref line; do
    local rate ref_checksum verdict=identical
    rate=$(field text_mb_per_s " $line")
    ref_checksum=$(field checksum " $line")
    [[ $ref_checksum == "$checksum" ]] || verdict="DIFFERENT TOKENS"
    printf '%-10s %-6s %10.2f %10.2f   %-14s %10.2f %7.2fx %7.2fx  %s\n' "$name" "$corpus_name" \
      "$(field text_mb_per_s "$cold")" "$(field text_mb_per_s "$warm")" "$ref" "$rate" \
      "$(awk -v a="$(field text_mb_per_s "$cold")" -v b="$rate" 'BEGIN { print a / b }')" \
      "$(awk -v a="$(field text_mb_per_s "$warm")" -v b="$rate" 'BEGIN { print a / b }')" "$verdict" |
      tee -a "$results"
  done <<<"$refs"
}
for corpus_name in code prose i18n; do
  corpus=$work/tok-$corpus_name.jsonl
  measure o200k "$corpus_name" "$corpus" tiktoken "$ranks/o200k_base.tiktoken" o200k
  measure cl100k "$corpus_name" "$corpus" tiktoken "$ranks/cl100k_base.tiktoken" cl100k
  measure gpt2 "$corpus_name" "$corpus" tiktoken "$ranks/gpt2.tiktoken" gpt2
  measure spm-bpe32k "$corpus_name" "$corpus" spm "$spm.model"
  measure spm-llama32k "$corpus_name" "$corpus" spm "$spm_llama.model"
done

# --- end to end against tiktoken ---------------------------------------------------------
# `dataprep preprocess` with one worker, from the jsonl to the published shards, the rank
# file's load included, against tiktoken's encode_ordinary of the same texts measured
# above (its load and JSON parsing left out): MB of text per wall second and per CPU
# second of the whole process (reader, worker and writer threads together).
echo
printf '%-8s %-6s %9s %12s %16s %14s %10s %10s\n' tokenizer corpus "text MB" "MB/s wall" "MB/CPU-second" \
  "tiktoken MB/s" "wall/ref" "CPU/ref" | tee -a "$results"
for tokenizer in o200k cl100k; do
  for corpus_name in code prose i18n; do
    corpus=$work/tok-$corpus_name.jsonl
    ref=$(awk -v t="$tokenizer" -v c="$corpus_name" '$1 == t && $2 == c && $5 == "tiktoken" { print $6 }' "$results")
    [[ -n $ref ]] || continue
    start=$(now)
    "/usr/bin/time" -v -o "$work/time.txt" "$dataprep" preprocess --quiet --input "$corpus" \
      --output-prefix "$work/tok-e2e" --tokenizer-model "$ranks/${tokenizer}_base.tiktoken" --append-eod \
      --workers 1 >"$work/e2e.txt" 2>&1
    wall=$(awk -v a="$start" -v b="$(now)" 'BEGIN { print b - a }')
    cpu=$(own_cpu "$work/time.txt")
    text_mb=$("$python" -c 'import json, sys; print(sum(len(json.loads(l)["text"].encode()) for l in open(sys.argv[1]) if l.strip()) / 1e6)' "$corpus")
    awk -v t="$tokenizer" -v c="$corpus_name" -v mb="$text_mb" -v w="$wall" -v cpu="$cpu" -v r="$ref" \
      'BEGIN { printf "%-8s %-6s %9.2f %12.2f %16.2f %14.2f %9.2fx %9.2fx\n", t, c, mb, mb / w, mb / cpu, r, mb / w / r, mb / cpu / r }' |
      tee -a "$results"
  done
done

# --- end to end ------------------------------------------------------------------------
if [[ -n $only ]]; then
  echo "== results in $results"
  exit 0
fi
echo
# MB/s is wall time, so it depends on what else the machine runs (the last column:
# cores other processes kept busy meanwhile); MB per CPU second does not.
printf '%-12s %8s %10s %16s %12s %12s\n' tokenizer workers "MB/s" "MB/CPU-second" "peak RSS MB" "others' cores" |
  tee -a "$results"
for tokenizer in o200k spm-bpe32k spm-llama32k; do
  model=$ranks/o200k_base.tiktoken
  [[ $tokenizer == spm-bpe32k ]] && model=$spm.model
  [[ $tokenizer == spm-llama32k ]] && model=$spm_llama.model
  for workers in 1 2; do
    busy=$(busy_ticks) start=$(now)
    "/usr/bin/time" -v -o "$work/time.txt" "$dataprep" preprocess --quiet --input "$code" \
      --output-prefix "$work/tok-e2e" --tokenizer-model "$model" --append-eod --workers "$workers" \
      >"$work/e2e.txt"
    cpu=$(own_cpu "$work/time.txt")
    others=$(others_cores "$busy" "$start" "$cpu")
    rate=$(sed -n 's/.*input .*(\([0-9.]*\) MB\/s).*/\1/p' "$work/e2e.txt")
    per_cpu=$(awk -v b="$(stat -c %s "$code")" -v c="$cpu" 'BEGIN { printf "%.2f", b / 1e6 / c }')
    rss=$(awk -F': ' '/Maximum resident/ { printf "%.0f", $2 / 1024 }' "$work/time.txt")
    printf '%-12s %8s %10s %16s %12s %12s\n' "$tokenizer" "$workers" "$rate" "$per_cpu" "$rss" "$others" |
      tee -a "$results"
  done
done

echo "== results in $results"
