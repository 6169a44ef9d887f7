#!/usr/bin/env python3
"""Roofline prediction of one GPT-2 124M training step on one H100 (issue 22's
"numbers before the device").

usage: gpu_roofline.py                 print docs/gpu-roofline.md's text
       gpu_roofline.py --write PATH    write it to PATH
       gpu_roofline.py --check PATH    exit 1 when PATH is not what this script writes

For every kernel of the target design (bf16 storage, flash-style attention that keeps
only the row log-sum-exp, residual adds fused into the next LayerNorm, the GELU in the
c_fc GEMM's epilogue, a one-pass classifier, one multi-tensor AdamW) it counts the
FLOPs the kernel executes and the fewest bytes it must move to and from HBM (each input
read once, each output written once; no cache reuse across kernels), and predicts its
time from the two ceilings: max(FLOPs / peak, bytes / bandwidth). Standard library only.
"""

import argparse
import sys
from dataclasses import dataclass

# The step: GPT-2 124M, bf16, micro-batch 16 at T = 1024.
B, T, L, C, NH = 16, 1024, 12, 768, 12
VOCAB, PADDED_VOCAB = 50257, 50304
BT = B * T

# The two ceilings of one H100 SXM (the runner's step 1 measures both on the lent GPU).
PEAK_FLOPS = 989e12  # dense bf16 tensor-core FLOP/s
HBM_BYTES_PER_S = 3.35e12

BF16, FP32, INT32 = 2, 4, 4

# Rough per-element FLOP counts of the memory-bound kernels; they never bind.
LAYERNORM_FORWARD_FLOPS = 8  # mean, variance, normalize, scale, shift
LAYERNORM_BACKWARD_FLOPS = 14
GELU_FLOPS = 12  # tanh approximation
CLASSIFIER_FLOPS = 6  # max, exp, sum, subtract, scale, one-hot subtract
ADAMW_FLOPS = 14

PARAMETERS_PER_LAYER = 12 * C * C + 13 * C  # qkv, attn proj, fc, fc proj weights and biases; two LayerNorms
PARAMETERS = PADDED_VOCAB * C + T * C + L * PARAMETERS_PER_LAYER + 2 * C


@dataclass
class Kernel:
    name: str
    count: int  # launches per step
    flops: float  # executed, per launch
    bytes: float  # fewest bytes moved, per launch
    model_flops: float = 0.0  # what 6N + 6LCT credits, per launch (GEMMs and attention only)


def gemm(name, count, m, k, n, read_bytes, write_bytes):
    """An (m x k) by (k x n) product: 2mkn FLOPs, all of them model FLOPs."""
    flops = 2.0 * m * k * n
    return Kernel(name, count, flops, read_bytes + write_bytes, flops)


def causal_pairs():
    """(query, key) pairs one head of one sequence scores under the causal mask."""
    return T * (T + 1) / 2


def step_kernels():
    hs = C // NH
    act = BT * C * BF16  # one (B, T, C) bf16 activation
    stats = BT * 2 * FP32  # LayerNorm mean and rstd
    lse = B * NH * T * FP32
    ks = []
    add = ks.append

    # Forward.
    add(Kernel("embedding forward (wte + wpe gather)", 1, BT * C, BT * INT32 + act + T * C * BF16 + act))
    add(Kernel("ln1 forward (layer 0)", 1, LAYERNORM_FORWARD_FLOPS * BT * C, act + 2 * C * BF16 + act + stats))
    add(gemm("qkv GEMM + bias", L, BT, C, 3 * C, act + 3 * C * C * BF16 + 3 * C * BF16, 3 * act))
    # Flash forward: S = QK^T and O = PV over the causal half; the full square is what
    # llm.c's 6LCT credits (4 · T · C per token per layer: 2 products of 2 · T · C).
    attn_fwd_model = 4.0 * B * NH * T * T * hs
    add(Kernel("attention forward (flash, causal)", L, 4.0 * B * NH * causal_pairs() * hs, 3 * act + act + lse,
               attn_fwd_model))
    add(gemm("attn proj GEMM + bias", L, BT, C, C, act + C * C * BF16 + C * BF16, act))
    add(Kernel("residual + ln2 forward (fused)", L, (1 + LAYERNORM_FORWARD_FLOPS) * BT * C,
               2 * act + 2 * C * BF16 + 2 * act + stats))
    fc = gemm("fc GEMM + bias + GELU epilogue", L, BT, C, 4 * C, act + 4 * C * C * BF16 + 4 * C * BF16,
              2 * 4 * act)  # the pre-GELU (aux, for the backward) and the GELU output
    fc.flops += GELU_FLOPS * BT * 4 * C
    add(fc)
    add(gemm("fc proj GEMM + bias", L, BT, 4 * C, C, 4 * act + 4 * C * C * BF16 + C * BF16, act))
    # Layer l's residual add fused with layer l + 1's ln1 (and the last one with ln_f).
    add(Kernel("residual + ln1/ln_f forward (fused)", L, (1 + LAYERNORM_FORWARD_FLOPS) * BT * C,
               2 * act + 2 * C * BF16 + 2 * act + stats))
    logits = BT * PADDED_VOCAB * BF16
    add(gemm("logits GEMM (x wte^T)", 1, BT, C, PADDED_VOCAB, act + PADDED_VOCAB * C * BF16, logits))
    add(Kernel("classifier (softmax, loss, dlogits in place)", 1, CLASSIFIER_FLOPS * BT * VOCAB,
               logits + BT * INT32 + logits + BT * FP32))

    # Backward. Weight gradients are fp32, written once (one micro-batch per step).
    add(gemm("logits dx GEMM", 1, BT, PADDED_VOCAB, C, logits + PADDED_VOCAB * C * BF16, act))
    add(gemm("logits dwte GEMM", 1, PADDED_VOCAB, BT, C, logits + act, PADDED_VOCAB * C * FP32))
    add(Kernel("ln_f/ln backward (+ residual grad)", 2 * L + 1, LAYERNORM_BACKWARD_FLOPS * BT * C,
               act + act + stats + 2 * C * BF16 + act + act + 2 * C * FP32))
    add(gemm("fc proj dx GEMM + dGELU epilogue", L, BT, C, 4 * C, act + 4 * C * C * BF16 + 4 * act, 4 * act))
    add(gemm("fc proj dweight GEMM", L, C, BT, 4 * C, act + 4 * act, 4 * C * C * FP32))
    add(gemm("fc dx GEMM", L, BT, 4 * C, C, 4 * act + 4 * C * C * BF16, act))
    add(gemm("fc dweight GEMM", L, 4 * C, BT, C, 4 * act + act, 4 * C * C * FP32))
    add(gemm("attn proj dx GEMM", L, BT, C, C, act + C * C * BF16, act))
    add(gemm("attn proj dweight GEMM", L, C, BT, C, act + act, C * C * FP32))
    # Flash backward over the causal half: S recomputed, then dV = P^T dO, dP = dO V^T,
    # dQ = dS K, dK = dS^T Q (5 products); the model count credits 8 · T · C per token.
    add(Kernel("attention backward (flash, causal)", L, 5 * 2.0 * B * NH * causal_pairs() * hs,
               3 * act + act + act + lse + 3 * act, 2 * attn_fwd_model))
    add(gemm("qkv dx GEMM", L, BT, 3 * C, C, 3 * act + 3 * C * C * BF16, act))
    add(gemm("qkv dweight GEMM", L, 3 * C, BT, C, 3 * act + act, 3 * C * C * FP32))
    bias_columns = 4 * C + C + C + 3 * C  # fc proj, fc, attn proj, qkv
    add(Kernel("bias-gradient column sums (4 per layer)", L, BT * bias_columns,
               BT * bias_columns * BF16 + bias_columns * FP32))
    # Every position's gradient is read once; each touched wte row is read and written
    # (at most min(BT, vocab) rows; BT taken); the wpe gradient is a sum over B.
    touched_rows = min(BT, VOCAB)
    add(Kernel("embedding backward (bucketed)", 1, 2 * BT * C,
               BT * INT32 + act + 2 * touched_rows * C * FP32 + T * C * FP32))

    # Optimizer: the gradient norm reads every gradient; AdamW reads parameter, gradient,
    # m, v (fp32), writes parameter, m, v and the bf16 working copy.
    add(Kernel("gradient norm", 1, 2 * PARAMETERS, PARAMETERS * FP32))
    add(Kernel("AdamW (one multi-tensor launch)", 1, ADAMW_FLOPS * PARAMETERS,
               PARAMETERS * (4 * FP32 + 3 * FP32 + BF16)))
    return ks


def model_flops_per_token():
    """llm.c's 6N + 6LCT, summed from the kernel rows (not from the formula)."""
    return sum(k.count * k.model_flops for k in step_kernels()) / BT


def fmt_us(seconds):
    return f"{seconds * 1e6:,.0f}"


def render():
    ks = step_kernels()
    lines = []
    out = lines.append
    out("# GPU roofline: one GPT-2 124M training step before the device")
    out("")
    out("Written by `benchmarks/gpu_roofline.py` (`--write docs/gpu-roofline.md`); the test")
    out("`gpu_roofline_doc` fails when this file is not what the script writes, and")
    out("`Flops.RooflineTableSumsToTheModelCount` (`training_test`) checks that the table's")
    out("GEMM and attention rows add up to `gpt_training_flops_per_token` (trainer/src/model/flops.cc).")
    out("")
    out(f"The step: GPT-2 124M ({PARAMETERS:,} parameters with the vocabulary padded to {PADDED_VOCAB}),")
    out(f"bf16, B = {B}, T = {T}, {L} layers, d = {C}, {NH} heads: {BT:,} tokens. The ceilings of one")
    out(f"H100 SXM: {PEAK_FLOPS / 1e12:.0f} TFLOP/s dense bf16 and {HBM_BYTES_PER_S / 1e12:.2f} TB/s HBM "
        "(the runner's step 1 measures both on the lent GPU: the bf16 cuBLASLt GEMM rate and the copy rate).")
    out("")
    out("**The design these numbers assume is the target of issue 22, not today's code**:")
    out("activations and activation gradients stored in bf16 by the kernel or GEMM epilogue")
    out("that computes them; weights read from the bf16 working copy; fp32 weight gradients,")
    out("master weights and AdamW moments; flash-style causal attention that keeps only the")
    out("row log-sum-exp (the backward recomputes the scores; the masked half of the square")
    out("is skipped); each residual add fused into the LayerNorm after it; the GELU in the")
    out("c_fc GEMM's epilogue and its derivative in the fc proj dx GEMM's epilogue; a")
    out("one-pass classifier writing dlogits over the bf16 logits; one AdamW launch.")
    out("")
    out("\"Bytes\" is the fewest a kernel must move: each input read once and each output")
    out("written once, nothing reused from a cache across kernels. \"Compute\" is FLOPs / peak,")
    out("\"memory\" is bytes / bandwidth, \"bound\" the larger (the kernel cannot be faster).")
    out("The elementwise kernels' FLOPs are rough counts; they are memory-bound by far.")
    out("Counts are launches per step; the other columns are totals over them.")
    out("")
    out("| kernel | launches | GFLOP | MB | compute µs | memory µs | bound µs | limit |")
    out("|---|---:|---:|---:|---:|---:|---:|---|")
    total_flops = total_bytes = total_bound = 0.0
    gemm_bound = 0.0
    for k in ks:
        flops, nbytes = k.count * k.flops, k.count * k.bytes
        compute, memory = flops / PEAK_FLOPS, nbytes / HBM_BYTES_PER_S
        bound = max(compute, memory)
        total_flops += flops
        total_bytes += nbytes
        total_bound += bound
        if k.model_flops:
            gemm_bound += bound
        limit = "compute" if compute >= memory else "memory"
        out(f"| {k.name} | {k.count} | {flops / 1e9:,.1f} | {nbytes / 1e6:,.1f} | {fmt_us(compute)} | "
            f"{fmt_us(memory)} | {fmt_us(bound)} | {limit} |")
    out(f"| **total** | {sum(k.count for k in ks)} | {total_flops / 1e9:,.1f} | {total_bytes / 1e6:,.1f} | "
        f"{fmt_us(total_flops / PEAK_FLOPS)} | {fmt_us(total_bytes / HBM_BYTES_PER_S)} | "
        f"{fmt_us(total_bound)} | |")
    out("")
    per_token = model_flops_per_token()
    step_model_flops = per_token * BT
    mfu = step_model_flops / (total_bound * PEAK_FLOPS)
    out("## What it predicts")
    out("")
    out(f"- model FLOPs per token (6N + 6LCT, as llm.c counts; the sum of the rows' GEMM and "
        f"full-square attention FLOPs): {per_token:,.0f}")
    out(f"- model FLOPs per step: {step_model_flops:,.0f}")
    out(f"- step time at the ceilings (the sum of the bound column): {total_bound * 1e3:.2f} ms, "
        f"{BT / total_bound:,.0f} tokens/s")
    out(f"- MFU at that step time: {mfu * 100:.1f}% (the issue's goal is 45%; llm.c and compiled "
        "PyTorch reach about 38%)")
    out(f"- of the step, the GEMM and attention rows are {gemm_bound * 1e3:.2f} ms; the memory-bound "
        f"rest is {(total_bound - gemm_bound) * 1e3:.2f} ms")
    out("")
    out("The causal attention executes fewer FLOPs than the model count credits (half the")
    out("square, plus the backward's recomputed scores: 7 · T · C per token per layer")
    out("executed against 12 · T · C credited), so the MFU at the ceilings can exceed the")
    out("compute share of the step. Real GEMMs reach 60-80% of the peak at these shapes and")
    out("launches cost a few µs each, so a measured step will be slower; the GPU run's")
    out("per-kernel times go beside this table in `docs/gpu-runs.md`, with a reason wherever")
    out("they differ from the bound by more than 1.5x.")
    out("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH")
    group.add_argument("--check", metavar="PATH")
    args = parser.parse_args()
    text = render()
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(text)
    elif args.check:
        with open(args.check, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.check} is not what {sys.argv[0]} writes: rerun it with --write", file=sys.stderr)
                return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
