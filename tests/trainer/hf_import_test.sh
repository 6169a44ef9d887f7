#!/usr/bin/env bash
# `train import-hf` against HuggingFace transformers (tests/reference/hf_import_check.py,
# in the venv of scripts/setup_reference_venv.sh --transformers; skipped, exit 77, when
# it cannot be made): GPT2LMHeadModels with random weights, saved in one file, in
# shards and in bf16, imported serially and into tp 2 x pp 2, give transformers' loss
# of a batch (1e-5 relative) and gradients (1e-4 of each tensor's largest) from the
# pieces a run loads (hf_import_batch, under mpirun for tp 2 x pp 2); import then
# export-hf reproduces every tensor bit for bit; `train` fine-tunes from the import
# (model.init_from) at step 0 with the loss falling; bad inputs are one-line errors.
#   hf_import_test.sh TRAIN HF_IMPORT_BATCH SOURCE_DIR DATAPREP FIXTURE_DIR MPIRUN...
set -euo pipefail
# shellcheck source=tests/trainer/hf_test_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/hf_test_common.sh" hf_import_check.py "$@"

reference make --out "$work/single"
"$python" "$source/tests/reference/hf_export_check.py" make-bytelevel "$work/single" >/dev/null
reference make --out "$work/sharded" --max-shard-size 40KB --seed 4
reference make --out "$work/bf16" --dtype bfloat16 --max-shard-size 100KB
reference make --out "$work/f16" --dtype float16

# Loss and gradients against transformers: serial, and tp 2 x pp 2 under mpirun.
for model in single sharded bf16 f16; do
  serial_gradients "$model"
  reference compare --hf "$work/$model" --dufu "$work/grads-$model.safetensors"
done
for model in single sharded; do
  tp2pp2_gradients "$model"
  ls "$work/ckpt-$model-tp2pp2" | grep -q '^model-tp01-pp001.safetensors$' || fail "no tp 2 x pp 2 piece files"
  reference compare --hf "$work/$model" --dufu "$work/grads-$model-tp2pp2.safetensors"
done

# The check must see another model's gradients as different.
reference make --out "$work/other" --seed 9 >/dev/null
if reference compare --hf "$work/other" --dufu "$work/grads-single.safetensors" >/dev/null; then
  fail "another model's loss and gradients passed the comparison"
fi

# import -> export: every tensor bit for bit, from the serial and the tp 2 x pp 2 import;
# the tokenizer the import copied is the one the export finds.
[[ -f $work/ckpt-single/tokenizer/tokenizer.json ]] || fail "the import did not copy tokenizer.json"
"$train" export-hf "$work/ckpt-single" "$work/export-single" >/dev/null 2>&1
reference same-tensors --hf "$work/single" --export "$work/export-single"
cmp "$work/single/tokenizer.json" "$work/export-single/tokenizer.json" || fail "the exported tokenizer.json differs"
for model in sharded-tp2pp2 bf16; do
  "$train" export-hf "$work/ckpt-$model" "$work/export-$model" -m "$work/single/tokenizer.json" >/dev/null 2>&1
  reference same-tensors --hf "$work/${model%-tp2pp2}" --export "$work/export-$model"
done

# Fine-tuning from the imports (model.init_from) on the fixture corpus tokenized with
# the imported tokenizer: the tp 2 x pp 2 import into one process and the serial one
# into tp 2 x pp 2 (both resharded on load) start from the same weights, so their
# first losses agree, unlike a run from fresh weights; the loss falls; the run starts
# at step 1 with its own optimizer.
finetune_setup "$work/single/tokenizer.json" 8 <<'TOML'
[model]
n_layer = 2
n_head = 4
d_model = 64
vocab_size = 300
seq_length = 32
TOML
logged "$work/ft.log" "$train" "$work/finetune.toml" model.init_from="$work/ckpt-single-tp2pp2" \
  run.dir="$work/ft-serial"
grep -q "initialized the weights from" "$work/ft.log" || fail "the run did not start from model.init_from"
logged "$work/ft.log" env OMP_NUM_THREADS=1 "${mpirun[@]}" -np 4 "$train" "$work/finetune.toml" \
  model.init_from="$work/ckpt-single" dist.tensor_parallel_size=2 dist.pipeline_parallel_size=2 \
  run.dir="$work/ft-tp2pp2"
logged "$work/ft.log" "$train" "$work/finetune.toml" train.steps=1 run.dir="$work/ft-fresh"
check_losses <<'PY'
serial, parallel, fresh = losses("ft-serial"), losses("ft-tp2pp2"), losses("ft-fresh")
print(f"fine-tune losses: serial {serial[0]:.6f} -> {serial[-1]:.6f}, tp 2 x pp 2 {parallel[0]:.6f} -> "
      f"{parallel[-1]:.6f}, fresh weights {fresh[0]:.6f}")
assert len(serial) == len(parallel) == 8, "not 8 steps from step 0"
for a, b in zip(serial, parallel):
    assert abs(a - b) <= 1e-4 * abs(a), f"serial {a} against tp 2 x pp 2 {b}"
assert abs(serial[0] - fresh[0]) > 1e-2 * abs(fresh[0]), "the imported weights give the fresh weights' loss"
assert serial[-1] < serial[0] - 0.5, "the loss did not fall"
PY
# The run's model shape must be the checkpoint's, named by its knob.
if "$train" "$work/finetune.toml" model.init_from="$work/ckpt-single" model.d_model=32 run.dir="$work/ft-bad" \
   >"$work/ft.log" 2>&1; then fail "trained a d_model 32 model from a d_model 64 checkpoint"; fi
grep -q "model.d_model = 64" "$work/ft.log" || { cat "$work/ft.log"; fail "no model.d_model in the error"; }

# Bad inputs: one line each, naming the key, tensor or file, and nothing written.
edit_config() {  # edit_config NAME PYTHON_STATEMENT: a copy of single with config.json edited
  rm -rf "$work/$1"
  cp -r "$work/single" "$work/$1"
  "$python" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); $2; json.dump(c, open(p, 'w'))" \
    "$work/$1/config.json"
}
edit_config relu 'c["activation_function"] = "relu"'
expect_error '"activation_function" is "relu"' "$work/relu"
edit_config layer_idx 'c["scale_attn_by_inverse_layer_idx"] = True'
expect_error '"scale_attn_by_inverse_layer_idx" is true' "$work/layer_idx"
edit_config upcast 'c["reorder_and_upcast_attn"] = True'
expect_error '"reorder_and_upcast_attn" is true' "$work/upcast"
edit_config cross 'c["add_cross_attention"] = True'
expect_error '"add_cross_attention" is true' "$work/cross"
edit_config llama 'c["architectures"] = ["LlamaForCausalLM"]; c["model_type"] = "llama"'
expect_error '"num_hidden_layers" is missing' "$work/llama"
edit_config opt 'c["architectures"] = ["OPTForCausalLM"]; c["model_type"] = "opt"'
expect_error '"architectures" is "OPTForCausalLM"; dufu imports GPT2LMHeadModel and LlamaForCausalLM' "$work/opt"
edit_config no_layers 'del c["n_layer"]'
expect_error '"n_layer" is missing' "$work/no_layers"
edit_config wide 'c["n_embd"] = 96'
expect_error 'tensor "transformer.wte.weight" has shape [300, 64], the config gives [300, 96]' "$work/wide"
expect_error 'tensor_parallel_size 3 does not divide n_head 4' "$work/single" --tensor-parallel-size 3
# A missing tensor: a shard left out of the index's directory is caught by its name.
rm -rf "$work/missing" && cp -r "$work/sharded" "$work/missing"
"$python" - "$work/missing" <<'PY'
import json, os, sys
d = sys.argv[1]; p = os.path.join(d, "model.safetensors.index.json"); index = json.load(open(p))
gone = index["weight_map"].pop("transformer.h.1.mlp.c_fc.bias")
index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != gone}
for f in set(os.listdir(d)) - set(index["weight_map"].values()):
    if f.startswith("model-"): os.remove(os.path.join(d, f))
json.dump(index, open(p, "w"))
PY
expect_error 'the model has no tensor "transformer.h.1.' "$work/missing"
# A dtype dufu does not take: F64.
edit_tensors f64 "$work/single" \
  'tensors["transformer.h.0.ln_1.bias"] = tensors["transformer.h.0.ln_1.bias"].astype("float64")'
expect_error 'tensor "transformer.h.0.ln_1.bias" has dtype F64; dufu imports F32, BF16 and F16' "$work/f64"
echo "import-hf against transformers: OK"
