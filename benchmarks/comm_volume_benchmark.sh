#!/usr/bin/env bash
# Communication volume of data-parallel training: `train` under mpirun for each layout
# (data-parallel ranks 2 and 4, replicated AdamW and ZeRO-1), the bytes each rank
# sends per step as the communicator counts them, against the analytic volume of
# Megatron's data parallelism for the same shapes - a ring all-reduce of the fp32
# gradients, 2(dp-1)/dp x 4 bytes x parameters; ZeRO-1 (Megatron's distributed
# optimizer) moves the same as a reduce-scatter of the gradients plus an all-gather of
# the parameters - and the share of the step spent inside communication. Tensor and
# pipeline layouts are not implemented yet, so they are not measured. A program for
# humans; nothing here runs as a test. About 3 minutes on 2 cores.
#
#   benchmarks/comm_volume_benchmark.sh [BUILD_DIR]        (default: build-bench)
#
# Environment: DUFU_BENCH_WORK (corpus, tokenizer, shard, runs; default
# build-bench-work), DUFU_BENCH_NO_BUILD=1 (use BUILD_DIR as it is).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench_name=comm_volume_benchmark
source "$root/benchmarks/bench_lib.sh"
build=${1:-$root/build-bench}
work=${DUFU_BENCH_WORK:-$root/build-bench-work}/comm
python=/usr/bin/python3
mpi_training_setup "$root" "$build" "$work"

# The "small" shapes of the training benchmark, one thread per rank.
model="model.n_layer=4 model.n_head=4 model.d_model=256 model.vocab_size=8000 model.seq_length=128"
common="$model data.blend=$work/fortunes data.cache_dir=$work/index-cache train.micro_batch=2 train.global_batch=8
  train.steps=6 train.threads=1 optim.warmup_steps=1 eval.interval=0 checkpoint.interval=0 run.log_interval=100"

printf '\n%-30s %14s %14s %8s %10s\n' "layout (dp, tp, pp)" "bytes/step" "analytic" ratio "comm time"
# dp tp pp zero
for layout in "2 1 1 0" "4 1 1 0" "2 1 1 1" "4 1 1 1" "1 2 1 0" "1 1 2 0" "1 1 4 0" "2 2 1 0" "2 1 2 0" \
              "1 2 2 0" "2 2 2 0"; do
  read -r dp tp pp zero <<<"$layout"
  ranks=$((dp * tp * pp))
  run=$work/run-dp$dp-tp$tp-pp$pp-zero$zero
  rm -rf "$run"
  # shellcheck disable=SC2086
  "${mpirun[@]}" -np "$ranks" "$train" $common dist.zero_stage=$zero dist.tensor_parallel_size=$tp \
    dist.pipeline_parallel_size=$pp run.dir="$run" >"$run.log" 2>&1 ||
    { cat "$run.log"; fail "the layout ($dp, $tp, $pp) zero=$zero run failed"; }
  "$python" "$root/benchmarks/comm_volume_analytic.py" "$run/metrics.jsonl" "$dp" "$tp" "$pp" "$zero"
done
echo
echo "bytes/step: payload rank 0 (tp 0, dp 0, first stage) sends per step, as dufu's communicator counts"
echo "it; analytic: Megatron's volume for the same rank (benchmarks/comm_volume_analytic.py). dufu's excess:"
echo "the loss and norm scalars, the vocab-parallel cross-entropy's per-row max and sums (tp), ZeRO-1's"
echo "padding, the loss broadcast (pp). comm time: share of the step inside communication (waiting for"
echo "slower ranks included; ranks beyond the cores are oversubscribed here)."
