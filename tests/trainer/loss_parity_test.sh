#!/usr/bin/env bash
# The GPU runner's loss-parity step (scripts/gpu_runner.sh, step 7) run on the CPU, so
# that its pieces are checked where CI runs: the weights train_benchmark saves before
# its first update, exported by `train export-hf`, loaded by transformers, give the
# loss train_benchmark computed on its first batch (fp32 within 1e-5 relative, bf16
# within 1e-2); a model whose weights differ from the saved ones must fail the check.
#   loss_parity_test.sh TRAIN_BENCHMARK TRAIN TOKENIZER_MODEL SOURCE_DIR
set -euo pipefail
train_benchmark=$1 train=$2 tokenizer=$3 source=$4
python=$("$source/scripts/setup_reference_venv.sh" --transformers 2>/dev/null | tail -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The fixture tokenizer has 2000 pieces: the model's vocabulary must match it.
shape=(--n-layer 2 --d-model 64 --n-head 2 --vocab 2000 --seq 32 --micro-batch 2 --steps 1 --warmup 0
       --sgemm-seconds 0.05)
for precision in fp32 bf16; do
  "$train_benchmark" "${shape[@]}" --precision "$precision" --save-initial "$work/$precision" >"$work/bench.log"
  "$train" export-hf "$work/$precision" "$work/hf-$precision" -m "$tokenizer" >"$work/export.log" 2>&1 ||
    { cat "$work/export.log"; exit 1; }
  "$python" "$source/tests/reference/hf_export_check.py" loss --export "$work/hf-$precision" \
    --batch "$work/$precision/first_batch.json"
done
# The check must see a different model: another seed's initial weights.
"$train_benchmark" "${shape[@]}" --seed 7 --save-initial "$work/other" >"$work/bench.log"
if "$python" "$source/tests/reference/hf_export_check.py" loss --export "$work/hf-fp32" \
     --batch "$work/other/first_batch.json"; then
  echo "FAIL: the loss of another model's batch passed the parity check"
  exit 1
fi
echo "loss parity: OK"
