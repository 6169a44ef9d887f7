#!/usr/bin/env bash
# The quickstart: installs what is needed, builds dufu, turns two real corpora from
# Debian packages - fortune cookies (`fortunes`, ~15k documents) and the prose of the
# Linux kernel's Documentation/ (`linux-source-6.1`) - into zstd-compressed jsonl,
# trains one sentencepiece tokenizer on both, preprocesses each into mmap shards,
# inspects one, then trains a small GPT on a 50/50 blend of the two for a few minutes,
# plots the loss, samples text from the last checkpoint and exports it as a HuggingFace
# directory. The commands after `mkdir` are the README's short tour, as written there
# (scripts/check_readme_tour.py, the test readme_tour, keeps the two equal). Everything lands in
# ./quickstart-out; running it again resumes (or finds finished) the same run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${DUFU_QUICKSTART_OUT:-$root/quickstart-out}
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build" -DDUFU_BUILD_TESTS=OFF -DDUFU_BUILD_BENCHMARKS=OFF
dataprep=$root/build/tools/dataprep/dataprep
train=$root/build/tools/train/train
mkdir -p "$out"

echo "== corpora: Debian's fortunes and the kernel's Documentation/ as jsonl.zst"
/usr/bin/python3 "$root/scripts/corpus/fortunes_to_jsonl.py" | zstd -q -f -o "$out/fortunes.jsonl.zst"
/usr/bin/python3 "$root/scripts/corpus/kernel_source_to_jsonl.py" --output "$out/kernel-docs.jsonl" \
  --path-prefix Documentation/ --suffixes .rst,.txt --max-bytes 12000000 --allow-fewer
zstd -q -f --rm "$out/kernel-docs.jsonl" -o "$out/kernel-docs.jsonl.zst"

echo "== train-tokenizer (one vocabulary for both corpora)"
"$dataprep" train-tokenizer --input "$out/fortunes.jsonl.zst" "$out/kernel-docs.jsonl.zst" \
  --model-prefix "$out/tokenizer" --vocab-size 8000 --model-type bpe

echo "== preprocess"
for corpus in fortunes kernel-docs; do
  "$dataprep" preprocess --input "$out/$corpus.jsonl.zst" --output-prefix "$out/$corpus" \
    --tokenizer "$out/tokenizer.model" --append-eod --impl mmap
done

echo "== inspect (the tokenizer comes from fortunes.dufu.json, written by preprocess)"
"$dataprep" inspect "$out/fortunes" --show 0

echo "== train: a small GPT on a 50/50 blend (configs/quickstart.toml)"
"$train" "$root/configs/quickstart.toml" \
  data.blend="0.5 $out/fortunes 0.5 $out/kernel-docs" data.cache_dir="$out/index-cache" run.dir="$out/run"

echo "== plot: the loss curves"
"$train" plot "$out/run" -o "$out/loss.png"

echo "== generate: text from the last checkpoint (with the tokenizer the run recorded)"
"$train" generate --checkpoint "$out/run" \
  --prompt "The kernel" --max-tokens 60 --temperature 0.8 --top-k 40 --seed 1

echo "== export-hf: the newest checkpoint as a HuggingFace directory"
rm -rf "$out/hf"  # export-hf writes a new directory only
"$train" export-hf "$out/run" "$out/hf"
