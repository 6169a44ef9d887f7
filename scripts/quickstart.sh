#!/usr/bin/env bash
# The quickstart: installs what is needed, builds dufu, turns Debian's fortune cookie
# corpus (package `fortunes`, ~15k real documents) into zstd-compressed jsonl, trains
# a sentencepiece tokenizer on it, preprocesses it into mmap shards and inspects them.
# Everything lands in ./quickstart-out.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${DUFU_QUICKSTART_OUT:-$root/quickstart-out}
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build" -DDUFU_BUILD_TESTS=OFF -DDUFU_BUILD_BENCHMARKS=OFF
dataprep=$root/build/tools/dataprep/dataprep
mkdir -p "$out"

echo "== corpus: Debian's fortunes as jsonl.zst"
/usr/bin/python3 "$root/scripts/corpus/fortunes_to_jsonl.py" | zstd -q -f -o "$out/fortunes.jsonl.zst"

echo "== train-tokenizer"
"$dataprep" train-tokenizer --input "$out/fortunes.jsonl.zst" --model-prefix "$out/fortunes" \
  --vocab-size 8000 --model-type bpe

echo "== preprocess"
"$dataprep" preprocess --input "$out/fortunes.jsonl.zst" --output-prefix "$out/fortunes" \
  --tokenizer-model "$out/fortunes.model" --append-eod --impl mmap

echo "== inspect"
"$dataprep" inspect "$out/fortunes" --model "$out/fortunes.model" --show 0
