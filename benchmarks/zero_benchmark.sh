#!/usr/bin/env bash
# ZeRO stages side by side: `train` under mpirun at data parallel 2 (two micro-batches
# a step) and 4 (one), stage 0 (replicated AdamW), stage 0 reducing each micro-batch
# (dist.reduce_each_micro_batch, the sums stages 2 and 3 make), ZeRO-1, and ZeRO-2 and
# 3 with each layer's reduction blocking and overlapped with the next layer's backward
# (dist.overlap_reduction), on a 12-layer model whose gradient is most of its memory.
# Per stage: the memory plan's gradients and model state (`train plan`, what the
# trainer checks at start), rank 0's measured peak resident memory, its bytes sent per
# step, and its median step time, each as a ratio to stage 0 measured in the same run
# at the same size. The machines are shared and noisy: read the times as rough; the
# memory is what the stages are for. A program for humans; nothing here runs as a
# test. About 10 minutes on 2 cores (DUFU_ZERO_RANKS="2" for the first half).
#
#   benchmarks/zero_benchmark.sh [BUILD_DIR]        (default: build-bench)
#
# Environment: DUFU_BENCH_WORK (corpus, tokenizer, shard, runs; default
# build-bench-work), DUFU_BENCH_NO_BUILD=1 (use BUILD_DIR as it is).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench_name=zero_benchmark
source "$root/benchmarks/bench_lib.sh"
build=${1:-$root/build-bench}
work=${DUFU_BENCH_WORK:-$root/build-bench-work}/zero
python=/usr/bin/python3
mpi_training_setup "$root" "$build" "$work"
: > "$work/empty.toml"  # train plan's config: every setting is on the command line

# 12 layers of 384: 21M of the 24.5M parameters are in the layers, whose gradients
# ZeRO-2 does not keep. One thread per rank.
model="model.n_layer=12 model.n_head=6 model.d_model=384 model.vocab_size=8000 model.seq_length=128"
common="$model data.blend=$work/fortunes data.cache_dir=$work/index-cache train.micro_batch=2 train.global_batch=8
  train.steps=6 train.threads=1 optim.warmup_steps=1 eval.interval=0 checkpoint.interval=0 run.log_interval=100"

for ranks in ${DUFU_ZERO_RANKS:-2 4}; do
printf '\n%d ranks\n%-28s %12s %12s %14s %10s %12s %10s\n' "$ranks" stage "plan: grads" "plan: total" "peak RSS" \
  "vs 0" "bytes/step" "step time"
for stage in "0" "0 dist.reduce_each_micro_batch=true" "1" "2" "2 dist.overlap_reduction=true" \
  "3" "3 dist.overlap_reduction=true"; do
  read -r zero extra <<<"$stage"
  case "$extra" in
    *reduce_each*) kind=" (each micro-batch)" tag=-each ;;
    *overlap_reduction=true*) kind=" (overlapped)" tag=-overlapped ;;
    *) kind="" tag="" ;;
  esac
  name="ZeRO-$zero$kind"
  run=$work/run-np$ranks-zero$zero$tag
  rm -rf "$run"
  # shellcheck disable=SC2086
  plan=$("$train" plan "$work/empty.toml" $common dist.zero_stage=$zero $extra --ranks "$ranks" 2>&1) ||
    { echo "$plan"; fail "train plan failed for $name"; }
  # shellcheck disable=SC2086
  "${mpirun[@]}" -np "$ranks" "$train" $common dist.zero_stage=$zero $extra run.dir="$run" >"$run.log" 2>&1 ||
    { cat "$run.log"; fail "the $name run failed"; }
  echo "$plan" >"$run.plan"
  "$python" - "$run/metrics.jsonl" "$name" "$work/stage0-np$ranks.json" "$run.plan" <<'PY'
import json, statistics, sys
metrics, name, baseline_path, plan_path = sys.argv[1:5]
plan_text = open(plan_path, encoding="utf-8").read()
records = [json.loads(line) for line in open(metrics, encoding="utf-8") if '"type":"train"' in line]
steps = records[1:]  # the first step also warms caches and threads
row = {"rss": max(r["peak_rss_bytes"] for r in records),
       "bytes": statistics.mean(r["comm_bytes"] for r in steps),
       "ms": statistics.median(r["ms_per_step"] for r in steps)}
# The plan's row of stage 0 of the pipeline (the only one here): its gradients and the
# model state (weights + gradients + moments), as printed.
line = next(l for l in plan_text.splitlines() if l.startswith("0 "))
cells = line.split()
row["plan_grads"] = " ".join(cells[5:7])
row["plan_total"] = " ".join(cells[-3:-1])  # before the verdict, "fits"
if name == "ZeRO-0":
    json.dump(row, open(baseline_path, "w"))
base = json.load(open(baseline_path))
print(f"{name:<28} {row['plan_grads']:>12} {row['plan_total']:>12} {row['rss'] / 2**20:11.0f} MiB"
      f" {row['rss'] / base['rss']:9.3f}x {row['bytes'] / 2**20:9.2f} MiB {row['ms'] / base['ms']:9.2f}x")
PY
done
done
echo
echo "plan: the memory plan's gradients (ZeRO-1 to 3: with the rank's reduced shard; ZeRO-2 and 3: the edges"
echo "and one layer's window, two overlapped) and total columns, as \`train plan\` prints them. peak RSS: rank 0's"
echo "resident peak (everything the process touched), and its ratio to stage 0's. bytes/step: what rank 0 sends"
echo "per step (ZeRO-2 and 3 reduce the layers' gradients every micro-batch: more bytes with accumulation; ZeRO-3"
echo "also gathers each layer's weights before the forward and the backward use them). step time:"
echo "median step, as a ratio to stage 0's of the same size in this run (ranks oversubscribe the machine's"
echo "cores: other load shows). overlapped: each layer's reduce-scatter started when its backward ends and"
echo "finished when its window is needed again (MPI's non-blocking Ialltoallv, tested between kernels)."
