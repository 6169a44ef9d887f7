#!/usr/bin/env bash
# `train import-hf` and `export-hf` of LlamaForCausalLM against HuggingFace transformers
# (tests/reference/hf_llama_check.py, in the venv of scripts/setup_reference_venv.sh
# --transformers; skipped, exit 77, when it cannot be made). LlamaForCausalLMs with
# random weights: 8 heads with 8 K/V heads and an untied head in one fp32 file; 8 heads
# with 2 K/V heads (GQA) and an untied head in fp32 shards; a tied head in bf16 shards.
# Imported serially and into tp 2 x pp 2, each gives transformers' loss of a batch
# (1e-5 relative) and gradients (1e-4 of each tensor's largest) from the pieces a run
# loads (hf_import_batch, under mpirun for tp 2 x pp 2); export-hf then
# from_pretrained has no missing or unexpected keys and transformers' logits exactly;
# import then export reproduces every tensor bit for bit; `train` fine-tunes from an
# import (model.init_from) with the loss falling; the keys dufu's llama cannot honour
# are one-line errors naming them.
#   hf_llama_test.sh TRAIN HF_IMPORT_BATCH SOURCE_DIR DATAPREP FIXTURE_DIR MPIRUN...
set -euo pipefail
# shellcheck source=tests/trainer/hf_test_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/hf_test_common.sh" hf_llama_check.py "$@"
models=(mha gqa tied)

reference make --out "$work/mha" --kv-heads 8
"$python" "$source/tests/reference/hf_export_check.py" make-bytelevel "$work/mha" >/dev/null
reference make --out "$work/gqa" --kv-heads 2 --max-shard-size 1MB --seed 4
reference make --out "$work/tied" --kv-heads 8 --tie --dtype bfloat16 --max-shard-size 1MB --seed 5

# Loss and gradients against transformers: serial, and tp 2 x pp 2 under mpirun.
for model in "${models[@]}"; do
  serial_gradients "$model"
  tp2pp2_gradients "$model"
  reference compare --hf "$work/$model" --dufu "$work/grads-$model.safetensors" "$work/grads-$model-tp2pp2.safetensors"
done
grep -q '^arch = "llama"$' "$work/ckpt-gqa/config.toml" && grep -q '^n_kv_head = 2$' "$work/ckpt-gqa/config.toml" ||
  { cat "$work/ckpt-gqa/config.toml"; fail "config.toml lacks the llama knobs"; }

# The check must see another model's gradients as different.
reference make --out "$work/other" --kv-heads 8 --seed 9 >/dev/null
if reference compare --hf "$work/other" --dufu "$work/grads-mha.safetensors" >/dev/null; then
  fail "another model's loss and gradients passed the comparison"
fi

# import -> export: every tensor bit for bit; from_pretrained loads every weight and
# computes the same logits; from the serial and the tp 2 x pp 2 imports.
"$train" export-hf "$work/ckpt-mha" "$work/export-mha" >"$work/export.log" 2>&1 || { cat "$work/export.log"; exit 1; }
cmp "$work/mha/tokenizer.json" "$work/export-mha/tokenizer.json" || fail "the exported tokenizer.json differs"
for model in mha gqa-tp2pp2 tied-tp2pp2; do
  [[ -d $work/export-$model ]] ||
    "$train" export-hf "$work/ckpt-$model" "$work/export-$model" -m "$work/mha/tokenizer.json" >"$work/export.log" 2>&1 ||
    { cat "$work/export.log"; exit 1; }
  reference export --hf "$work/${model%-tp2pp2}" --export "$work/export-$model"
done

# Fine-tuning from the tp 2 x pp 2 GQA import in one process (resharded on load): the
# run starts at step 1 from the imported weights, whose loss is not a fresh model's,
# and the loss falls.
finetune_setup "$work/mha/tokenizer.json" 6 <<'TOML'
[model]
arch = "llama"
n_layer = 2
n_head = 8
n_kv_head = 2
d_model = 256
ffn_hidden = 512
rope_theta = 500000
norm_eps = 1e-5
vocab_size = 300
seq_length = 32
TOML
logged "$work/ft.log" "$train" "$work/finetune.toml" model.init_from="$work/ckpt-gqa-tp2pp2" run.dir="$work/ft"
grep -q "initialized the weights from" "$work/ft.log" || fail "the run did not start from model.init_from"
logged "$work/ft.log" "$train" "$work/finetune.toml" train.steps=1 run.dir="$work/ft-fresh"
check_losses <<'PY'
tuned, fresh = losses("ft"), losses("ft-fresh")
print(f"fine-tune losses: {tuned[0]:.6f} -> {tuned[-1]:.6f}, fresh weights {fresh[0]:.6f}")
assert len(tuned) == 6, "not 6 steps from step 0"
assert abs(tuned[0] - fresh[0]) > 1e-2 * abs(fresh[0]), "the imported weights give the fresh weights' loss"
assert tuned[-1] < tuned[0] - 0.3, "the loss did not fall"
PY
# The run's model shape must be the checkpoint's, named by its knob.
if "$train" "$work/finetune.toml" model.init_from="$work/ckpt-gqa" model.n_kv_head=4 run.dir="$work/ft-bad" \
   >"$work/ft.log" 2>&1; then fail "trained an n_kv_head 4 model from an n_kv_head 2 checkpoint"; fi
grep -q "n_kv_head" "$work/ft.log" || { cat "$work/ft.log"; fail "no n_kv_head in the error"; }

# What dufu's llama cannot compute: one line each, naming the key, and nothing written.
edit_config() {  # edit_config NAME PYTHON_STATEMENT: a copy of mha with config.json edited
  rm -rf "$work/$1"
  mkdir "$work/$1"
  ln -s "$work/mha/model.safetensors" "$work/$1/model.safetensors"
  "$python" -c "import json,sys; c=json.load(open(sys.argv[1])); $2; json.dump(c, open(sys.argv[2], 'w'))" \
    "$work/mha/config.json" "$work/$1/config.json"
}
edit_config relu 'c["hidden_act"] = "relu"'
expect_error '"hidden_act" is "relu"' "$work/relu"
edit_config attention_bias 'c["attention_bias"] = True'
expect_error '"attention_bias" is true' "$work/attention_bias"
edit_config mlp_bias 'c["mlp_bias"] = True'
expect_error '"mlp_bias" is true' "$work/mlp_bias"
edit_config rope_scaling 'c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}'
expect_error '"rope_scaling" is {"rope_type":"llama3","factor":8.0} (llama3)' "$work/rope_scaling"
edit_config linear_rope 'c["rope_scaling"] = {"type": "linear", "factor": 2.0}'
expect_error '(linear)' "$work/linear_rope"
edit_config window 'c["sliding_window"] = 16'
expect_error '"sliding_window" is 16' "$work/window"
edit_config use_window 'c["use_sliding_window"] = True'
expect_error '"use_sliding_window" is true' "$work/use_window"
edit_config head_dim 'c["head_dim"] = 64'
expect_error '"head_dim" is 64' "$work/head_dim"
edit_config qwen2 'c["architectures"] = ["Qwen2ForCausalLM"]; c["model_type"] = "qwen2"'
expect_error 'Qwen2ForCausalLM, which dufu does not import: its q, k and v projections have biases' "$work/qwen2"
edit_config kv3 'c["num_key_value_heads"] = 3'
expect_error '"num_key_value_heads" 3 does not divide "num_attention_heads" 8' "$work/kv3"
expect_error 'n_kv_head 2 is not divisible by the tensor parallel size 4' "$work/gqa" --tensor-parallel-size 4
# A window as long as the context is no window: Mistral's config with a null window
# imports as the same model.
edit_config mistral 'c["architectures"] = ["MistralForCausalLM"]; c["model_type"] = "mistral"; c["sliding_window"] = 32'
"$train" import-hf "$work/mistral" "$work/ckpt-mistral" --no-tokenizer >/dev/null 2>&1 || fail "refused a Mistral without a sliding window"
# Biases as Qwen2 saves them, with a config that does not say so: the tensor is named.
edit_tensors bias "$work/mha" \
  'tensors["model.layers.0.self_attn.q_proj.bias"] = tensors["model.layers.0.input_layernorm.weight"].copy()'
expect_error 'unexpected tensor "model.layers.0.self_attn.q_proj.bias"' "$work/bias"
echo "import-hf and export-hf of LlamaForCausalLM against transformers: OK"
