#!/usr/bin/env python3
"""One row of comm_volume_benchmark.sh: the bytes rank 0 sent per step (from a run's
metrics.jsonl) next to Megatron's analytic volume for the same rank and shapes.

usage: comm_volume_analytic.py METRICS.jsonl DP TP PP ZERO_STAGE

The run is the benchmark's model: d_model C 256, 4 layers, vocabulary 8000 padded to a
multiple of 128 x tp, seq T 128, micro-batch b 2, global batch 8, so a = 8 / (b dp)
micro-batches per step. Rank 0 is tp 0, dp 0 and the first pipeline stage, holding
layers [0, 4 / pp). Megatron's volumes for that rank per step, in bytes it sends:
  tensor parallel  per micro-batch, all-reduces of b x T x C fp32 activations: 2 per
                   layer forward (after the row-parallel projections), 2 per layer
                   backward (before the column-parallel ones), 1 after the vocab-
                   parallel embedding, and 1 for the gradient entering the LM head when
                   the first stage is also the last; a ring all-reduce sends
                   2 (n - 1) / n of the buffer;
  pipeline         the first stage sends b x T x C activations per micro-batch and
                   all-reduces the tied embedding's gradient (V / tp x C) with the
                   last stage;
  data parallel    the ring all-reduce of the rank's gradients (ZeRO-1's reduce-scatter
                   plus all-gather moves the same).
Stdlib only."""
import json
import sys

C, LAYERS, T, MICRO_BATCH, GLOBAL_BATCH, VOCAB = 256, 4, 128, 2, 8, 8000


def ring(ranks, nbytes):
    """Bytes one rank sends in a ring all-reduce of nbytes over `ranks` ranks."""
    return 2 * (ranks - 1) / ranks * nbytes


def rank0_parameters(tp, pp, padded_vocab):
    """Parameters rank 0 holds: its tensor-parallel shard of the first stage."""
    layers = LAYERS // pp
    per_layer = 6 * C + (12 * C * C + 7 * C) // tp  # LayerNorms and row-parallel biases replicated
    count = padded_vocab // tp * C + T * C + layers * per_layer
    if pp == 1:
        count += 2 * C  # ln_f: the first stage is also the last
    return count


def main():
    metrics = sys.argv[1]
    dp, tp, pp, zero = (int(x) for x in sys.argv[2:6])
    records = [json.loads(line) for line in open(metrics, encoding="utf-8") if '"type":"train"' in line]
    steps = records[1:]  # the first step also warms caches and threads
    measured = sum(r["comm_bytes"] for r in steps) / len(steps)
    share = sum(r["comm_seconds"] / (r["ms_per_step"] / 1e3) for r in steps) / len(steps)

    padded_vocab = -(-VOCAB // (128 * tp)) * 128 * tp
    micro_batches = GLOBAL_BATCH // (MICRO_BATCH * dp)
    activation = 4 * MICRO_BATCH * T * C
    layers = LAYERS // pp
    tensor = micro_batches * (4 * layers + 1 + (1 if pp == 1 else 0)) * ring(tp, activation) if tp > 1 else 0
    pipeline = micro_batches * activation + ring(2, 4 * padded_vocab // tp * C) if pp > 1 else 0
    data = ring(dp, 4 * rank0_parameters(tp, pp, padded_vocab)) if dp > 1 else 0
    analytic = tensor + pipeline + data

    name = f"({dp}, {tp}, {pp}){' ZeRO-1' if zero else ''}"
    print(f"{name:<30} {measured:>14,.0f} {analytic:>14,.0f} {measured / analytic:>8.3f} {100 * share:>9.1f}%")


if __name__ == "__main__":
    main()
