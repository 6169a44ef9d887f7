# shellcheck shell=bash
# What hf_import_test.sh (GPT2LMHeadModel) and hf_llama_test.sh (LlamaForCausalLM)
# share; sourced by them, after `set -euo pipefail`, with their own arguments:
#   source hf_test_common.sh CHECK_SCRIPT TRAIN HF_IMPORT_BATCH SOURCE_DIR DATAPREP FIXTURE_DIR MPIRUN...
# sets train, batch_tool, source, dataprep, fixtures, mpirun (an array), python (the
# transformers venv's; exit 77, skipped, when it cannot be made) and work (a directory
# removed on exit), and defines the helpers below. CHECK_SCRIPT is the script of
# tests/reference that `reference` runs.
check_script=$1 train=$2 batch_tool=$3 source=$4 dataprep=$5 fixtures=$6
shift 6
mpirun=("$@")
if ! python=$("$source/scripts/setup_reference_venv.sh" --transformers 2>/dev/null | tail -n 1) ||
   [[ ! -x $python ]]; then
  echo "SKIP: the transformers reference venv (scripts/setup_reference_venv.sh --transformers) cannot be made"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
reference() { "$python" "$source/tests/reference/$check_script" "$@"; }
fail() { echo "FAIL: $*"; exit 1; }

logged() {  # logged LOG COMMAND...: runs COMMAND into LOG; shows LOG and exits 1 if it fails
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
}

# Imports $work/MODEL serially into $work/ckpt-MODEL and writes the loss and gradients
# of its batch.bin that a run computes into $work/grads-MODEL.safetensors.
serial_gradients() {  # serial_gradients MODEL
  logged "$work/import.log" "$train" import-hf "$work/$1" "$work/ckpt-$1"
  "$batch_tool" "$work/ckpt-$1" "$work/$1/batch.bin" 2 16 "$work/grads-$1.safetensors"
}
# The same into tp 2 x pp 2 pieces ($work/ckpt-MODEL-tp2pp2), the gradients computed
# by 4 ranks under mpirun ($work/grads-MODEL-tp2pp2.safetensors).
tp2pp2_gradients() {  # tp2pp2_gradients MODEL
  logged "$work/import.log" "$train" import-hf "$work/$1" "$work/ckpt-$1-tp2pp2" --tensor-parallel-size 2 \
    --pipeline-parallel-size 2
  OMP_NUM_THREADS=1 "${mpirun[@]}" -np 4 "$batch_tool" "$work/ckpt-$1-tp2pp2" "$work/$1/batch.bin" 2 16 \
    "$work/grads-$1-tp2pp2.safetensors"
}

# The fixture corpus tokenized with TOKENIZER into $work/shard, and $work/finetune.toml:
# the [model] table read from stdin on that shard, STEPS steps of 4 samples, no
# evaluation and no checkpoints.
finetune_setup() {  # finetune_setup TOKENIZER STEPS <<'TOML' [model] ... TOML
  "$dataprep" preprocess -q --append-eod -i "$fixtures/fortunes.jsonl" -m "$1" -o "$work/shard" >/dev/null
  cat >"$work/finetune.toml" <<TOML
$(cat)
[data]
blend = "$work/shard"
cache_dir = "$work/cache"
split = "90,10,0"
workers = 1
[train]
micro_batch = 2
global_batch = 4
steps = $2
threads = 1
[optim]
lr = 1e-3
min_lr = 1e-4
warmup_steps = 0
[eval]
interval = 0
[checkpoint]
interval = 0
TOML
}

# Runs the Python checks read from stdin with losses(RUN): the training losses of
# $work/RUN, whose steps must be 1, 2, 3 and so on.
check_losses() {  # check_losses <<'PY' CHECKS PY
  python3 - "$work" <<PY
import json, sys
def losses(run):
    lines = [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
    train = [l for l in lines if l["type"] == "train"]
    assert [l["step"] for l in train] == list(range(1, len(train) + 1)), f"{run}: steps {[l['step'] for l in train]}"
    return [l["loss"] for l in train]
$(cat)
PY
}

# A refused import: one line naming WANTED, and nothing written.
expect_error() {  # expect_error WANTED DIR [flags...]
  local wanted=$1 dir=$2
  shift 2
  if "$train" import-hf "$dir" "$work/refused" "$@" >"$work/out.log" 2>&1; then fail "imported $dir"; fi
  grep -qF -- "$wanted" "$work/out.log" || { cat "$work/out.log"; fail "no '$wanted' in the error"; }
  [[ $(grep -c . "$work/out.log") -eq 1 ]] || { cat "$work/out.log"; fail "the error is not one line"; }
  [[ ! -e $work/refused ]] || fail "a refused import left $work/refused"
}

# $work/NAME: SOURCE's config.json, and its model.safetensors with the Python STATEMENT
# run on `tensors` (its arrays by name, numpy).
edit_tensors() {  # edit_tensors NAME SOURCE STATEMENT
  rm -rf "${work:?}/$1" && mkdir "$work/$1" && cp "$2/config.json" "$work/$1/"
  "$python" - "$2" "$work/$1" <<PY
import sys
from safetensors.numpy import load_file, save_file
tensors = load_file(sys.argv[1] + "/model.safetensors")
$3
save_file(tensors, sys.argv[2] + "/model.safetensors", metadata={"format": "pt"})
PY
}
