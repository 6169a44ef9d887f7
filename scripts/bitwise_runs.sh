#!/usr/bin/env bash
# A repeatable bitwise check that a change moved no numbers (issue #43's acceptance):
# the 6-step runs single, dp 2, (dp, tp, pp) = (2, 2, 2), ZeRO-3 at dp 2, bf16, full
# recompute and Llama, each summed up in one digest file. Run it with the binaries of
# the commit before a change and of the change, on the same machine, and diff:
#
#   scripts/bitwise_runs.sh BUILD_DIR OUT_DIR
#   scripts/bitwise_runs.sh /work/base/build /tmp/bitwise/base
#   scripts/bitwise_runs.sh build /tmp/bitwise/new
#   diff /tmp/bitwise/base/digest.txt /tmp/bitwise/new/digest.txt
#
# BUILD_DIR is a CMake build directory with the `train` and `dataprep` targets built
# (they land in BUILD_DIR/tools/train/train and BUILD_DIR/tools/dataprep/dataprep).
# OUT_DIR gets the data (once: data/ is reused while data/done names the same
# dataprep binary, by its sha256), one run
# directory per layout under runs/ (made afresh each time), digest.txt and
# timings.txt (seconds per step of the script; not part of the digest). Takes well
# under a minute on 2 cores (about 25 s: 3 s of data, 1 to 9 s a run). MPIRUN names
# another mpirun (default: the one on PATH).
#
# The data: the first 3000 of Debian's fortune cookies (scripts/corpus/
# fortunes_to_jsonl.py, as scripts/quickstart.sh and the test fixture read them), a
# 1000-piece sentencepiece BPE tokenizer trained on them (one thread, fixed seed) and
# one mmap shard. The model: the tests' parallel-layout config (4 layers, d_model 64,
# 4 heads, seq 32, micro-batch 2, global batch 8, 6 steps, one training thread per
# rank, evaluations at steps 3 and 6 of 2 micro-batches, a checkpoint at step 6).
#
# What digest.txt holds, per run, and what it leaves out:
# - From metrics.jsonl (rank 0 writes it), every line's numbers as the text the run
#   wrote: train lines' step, loss, lr, grad_norm, consumed_samples, consumed_tokens,
#   skipped; eval lines' step, val_loss, val_perplexity. Left out: tokens_per_second,
#   ms_per_step, mfu, comm_seconds and peak_rss_bytes (they measure time and the
#   host), and the comm_bytes* counters (traffic, not results: a refactor of the
#   collectives may legitimately change them).
# - sha256 of every file of checkpoints/step_00000006/ (model and optimizer
#   .safetensors of every piece and shard, tokenizer/tokenizer.model), except:
#   * config.toml: left out. It holds absolute paths (data.blend, data.cache_dir,
#     run.dir under OUT_DIR, which differs between the two builds' runs) and every
#     knob's help text as comments, which a docs edit changes.
#   * state.json: hashed after normalising, not as written: its `config_toml` field
#     (the same text as config.toml) is dropped and OUT_DIR in its strings (the
#     shards' prefixes) is replaced by the word OUT_DIR. The rest (step, consumed
#     counts, loader state, seeds, layout, and every .safetensors file's size and
#     sha256) is kept.
#   Nothing else of the run directory is hashed: its config.toml is the one above,
#   and events.out.tfevents.<time>.<host> records wall times (and the host in its
#   name).
# - For the data: sha256 of the corpus, the tokenizer model and vocabulary, the
#   shard's .bin and .idx, and its .dufu.json sidecar with OUT_DIR replaced (it
#   records the tokenizer's absolute path).
# Not deterministic as written, so rewritten before use: the tokenizer model.
# sentencepiece stores the prefix it trained under in the model
# (TrainerSpec.model_prefix), and `dataprep train-tokenizer` trains under the
# temporary OUT_DIR/data/.tokenizer.tmp.PID, so two trainings differ by the PID (and
# OUT_DIR). The script sets that field to "tokenizer" (fixed_model_prefix) before
# preprocess reads the model; everything downstream (the shard's sidecar, the
# checkpoints' tokenizer/ copy and the tokenizer's sha256 in state.json) then
# depends only on the pieces and the rest of the spec. data/tokenizer.raw.model
# keeps dataprep's bytes.
# Nothing in the digest records time, the host or OUT_DIR, so two runs of the same
# binaries on one machine give the same file (checked: run twice, diff).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
dataprep=$build/tools/dataprep/dataprep
train=$build/tools/train/train
for tool in "$dataprep" "$train"; do
  if [[ ! -x $tool ]]; then
    echo "$0: no $tool; build it: cmake --build $build --target train dataprep" >&2
    exit 1
  fi
done
python=/usr/bin/python3
mpirun=${MPIRUN:-mpirun}
mpi_flags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
export OMP_NUM_THREADS=1
export LC_ALL=C

# Written as digest.txt.partial and renamed at the end: a failed run leaves no digest.txt.
rm -f "$out/digest.txt"
digest=$out/digest.txt.partial
timings=$out/timings.txt
: > "$digest"
: > "$timings"

# FILE with OUT_DIR's path replaced by the word OUT_DIR, and for a state.json without
# its config_toml field, on stdout.
normalised() {
  "$python" - "$1" "$out" <<'EOF'
import json, sys
path, out = sys.argv[1], sys.argv[2]
text = open(path, encoding="utf-8").read()
if path.endswith("state.json"):
    state = json.loads(text)
    state.pop("config_toml", None)
    text = json.dumps(state, indent=1, ensure_ascii=False) + "\n"
sys.stdout.write(text.replace(out, "OUT_DIR"))
EOF
}

sha() { sha256sum "$1" | cut -d' ' -f1; }
normalised_sha() { normalised "$1" | sha256sum | cut -d' ' -f1; }

# fixed_model_prefix IN OUT: the sentencepiece ModelProto IN with its trainer_spec
# (field 2) rewritten: model_prefix (its field 2) "tokenizer", input (field 1) gone.
fixed_model_prefix() {
  "$python" - "$1" "$2" <<'EOF'
import sys

def varint(buf, i):
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i

def encode_varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)

def fields(buf):
    """(number, wire type, the field's bytes, its payload) of each field of a message."""
    i = 0
    while i < len(buf):
        start = i
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        payload = None
        if wire == 0:
            _, i = varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            length, i = varint(buf, i)
            payload = buf[i:i + length]
            i += length
        else:
            sys.exit(f"fixed_model_prefix: wire type {wire} at byte {start}")
        if i > len(buf):
            sys.exit("fixed_model_prefix: truncated message")
        yield number, wire, buf[start:i], payload

def length_delimited(number, payload):
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload

def trainer_spec(buf):
    out = bytearray()
    for number, wire, raw, _ in fields(buf):
        if wire == 2 and number == 2:
            out += length_delimited(2, b"tokenizer")
        elif not (wire == 2 and number == 1):
            out += raw
    return bytes(out)

model = open(sys.argv[1], "rb").read()
out = bytearray()
specs = 0
for number, wire, raw, payload in fields(model):
    if wire == 2 and number == 2:
        out += length_delimited(2, trainer_spec(payload))
        specs += 1
    else:
        out += raw
if specs != 1:
    sys.exit(f"fixed_model_prefix: {specs} trainer_spec fields in {sys.argv[1]}")
open(sys.argv[2], "wb").write(out)
EOF
}

# --- the data, once
data=$out/data
make_data() {
  rm -rf "$data"
  mkdir -p "$data"
  "$python" "$root/scripts/corpus/fortunes_to_jsonl.py" > "$data/all.jsonl" 2> "$data/corpus.log"
  head -n 3000 "$data/all.jsonl" > "$data/fortunes.jsonl"
  rm "$data/all.jsonl"
  "$dataprep" train-tokenizer --input "$data/fortunes.jsonl" --model-prefix "$data/tokenizer" \
    --vocab-size 1000 --model-type bpe --seed 7 --threads 1 > "$data/tokenizer.log" 2>&1 ||
    { cat "$data/tokenizer.log" >&2; exit 1; }
  # sentencepiece records the prefix it trained under, dataprep's temporary
  # OUT_DIR/data/.tokenizer.tmp.PID, in the model (TrainerSpec.model_prefix): the
  # bytes would differ from run to run by the PID alone. Set it to "tokenizer" (and
  # drop TrainerSpec.input, the paths of file inputs, empty here) before anything
  # reads the model; tokenizer.raw.model keeps what dataprep wrote.
  mv "$data/tokenizer.model" "$data/tokenizer.raw.model"
  fixed_model_prefix "$data/tokenizer.raw.model" "$data/tokenizer.model"
  "$dataprep" preprocess -q --append-eod --impl mmap --workers 1 -i "$data/fortunes.jsonl" \
    -m "$data/tokenizer.model" -o "$data/fortunes" > "$data/preprocess.log" 2>&1 ||
    { cat "$data/preprocess.log" >&2; exit 1; }
  echo "$dataprep_sha" > "$data/done"
}
dataprep_sha=$(sha "$dataprep")
if [[ ! -f $data/done || $(cat "$data/done") != "$dataprep_sha" ]]; then
  start=$(date +%s)
  make_data
  echo "data $(($(date +%s) - start)) s" >> "$timings"
fi
echo "== data" >> "$digest"
for file in fortunes.jsonl tokenizer.model tokenizer.vocab fortunes.bin fortunes.idx; do
  hash=$(sha "$data/$file")
  echo "sha256 $file $hash" >> "$digest"
done
hash=$(normalised_sha "$data/fortunes.dufu.json")
echo "sha256 fortunes.dufu.json(normalised) $hash" >> "$digest"

config=$out/bitwise.toml
cat > "$config" <<EOF
# scripts/bitwise_runs.sh: the tests' parallel-layout config on the fortunes shard.
[model]
n_layer = 4
n_head = 4
d_model = 64
vocab_size = 1000
seq_length = 32
[data]
blend = "$data/fortunes"
split = "90,10,0"
workers = 1
[train]
micro_batch = 2
global_batch = 8
steps = 6
threads = 1
[optim]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
[eval]
interval = 3
batches = 2
[checkpoint]
interval = 0
keep = 1
EOF

# The digest lines of one metrics.jsonl line: KEY=VALUE with VALUE the text as written.
metrics_line() {
  local line=$1 type key keys=() fields=()
  [[ $line =~ \"type\":\"([a-z]+)\" ]] || { echo "$0: no type in: $line" >&2; exit 1; }
  type=${BASH_REMATCH[1]}
  case $type in
    train) keys=(step loss lr grad_norm consumed_samples consumed_tokens skipped) ;;
    eval) keys=(step val_loss val_perplexity) ;;
    *) echo "$0: unknown metrics type $type in: $line" >&2; exit 1 ;;
  esac
  for key in "${keys[@]}"; do
    [[ $line =~ \"$key\":([^,}]*) ]] || { echo "$0: no $key in: $line" >&2; exit 1; }
    fields+=("$key=${BASH_REMATCH[1]}")
  done
  echo "$type ${fields[*]}"
}

# run NAME RANKS OVERRIDES...: a fresh 6-step run, then its digest lines.
run() {
  local name=$1 ranks=$2 dir=$out/runs/$1 checkpoint file line hash start
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir"
  local command=("$train" "$config" "run.dir=$dir/run" "data.cache_dir=$dir/cache" "$@")
  if [[ $ranks -gt 1 ]]; then command=("$mpirun" "${mpi_flags[@]}" -np "$ranks" "${command[@]}"); fi
  # A hung run (a rank waiting on a collective) fails after 10 minutes.
  command=(timeout -k 10 600 "${command[@]}")
  echo "== $name: ${command[*]}" >&2
  start=$(date +%s)
  if ! "${command[@]}" > "$dir/train.log" 2>&1; then
    tail -n 30 "$dir/train.log" >&2
    echo "$0: run $name failed; its output: $dir/train.log" >&2
    exit 1
  fi
  echo "$name $(($(date +%s) - start)) s" >> "$timings"
  checkpoint=$dir/run/checkpoints/step_00000006
  [[ -f $checkpoint/state.json ]] || { echo "$0: run $name left no $checkpoint" >&2; exit 1; }
  echo "== run $name (ranks $ranks: $*)" >> "$digest"
  while IFS= read -r line; do
    line=$(metrics_line "$line")
    echo "$line" >> "$digest"
  done < "$dir/run/metrics.jsonl"
  # Every file of the checkpoint, by its path in it, in byte order (LC_ALL=C).
  while IFS= read -r file; do
    case $file in
      config.toml) ;;  # paths and help text: see the header
      state.json)
        hash=$(normalised_sha "$checkpoint/$file")
        echo "sha256 state.json(normalised) $hash" >> "$digest" ;;
      *)
        hash=$(sha "$checkpoint/$file")
        echo "sha256 $file $hash" >> "$digest" ;;
    esac
  done < <(cd "$checkpoint" && find . -type f -printf '%P\n' | sort)
}

run single 1
run dp2 2
run dp2_tp2_pp2 8 dist.tensor_parallel_size=2 dist.pipeline_parallel_size=2
run zero3_dp2 2 dist.zero_stage=3
run bf16 1 train.precision=bf16
run recompute_full 1 train.recompute=full
run llama 1 model.arch=llama model.n_kv_head=2

mv "$digest" "$out/digest.txt"
echo "digest: $out/digest.txt ($(wc -l < "$out/digest.txt") lines); timings: $timings" >&2
