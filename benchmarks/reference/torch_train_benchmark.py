#!/usr/bin/python3
"""PyTorch's training throughput on one GPT shape: the baseline of benchmarks/train_benchmark.sh.

The same step as benchmarks/train_benchmark.cc, on the same model: the GPT of
tests/reference/gpt_torch_reference.py (the oracle dufu's GPT is tested against:
vocabulary padded to a multiple of 128 rows of wte, the LM head computes all padded
logits and the loss takes F.cross_entropy over the first vocab_size of them, as dufu
masks the padding), GPT-2's initialisation, fp32, on a random batch drawn once:

  optimizer.zero_grad(set_to_none=True); loss = model(tokens, targets); loss.backward()
  clip_grad_norm_(1.0); optimizer.step()   # AdamW(0.9, 0.95), eps 1e-8, decay 0.1 on 2-D params

warmup steps, then timed steps. Like the dufu program it checks that the first loss is
close to ln(vocab) and that the loss falls on the repeated batch before it reports.
Threads: torch.set_num_threads(--threads) (default OMP_NUM_THREADS, else all cores);
OpenBLAS, which Debian's torch calls for its matmuls, reads OMP_NUM_THREADS too, so
the driver sets it. Run with Debian's /usr/bin/python3 (python3-torch).

On a GPU (--device cuda; the GPU bundle's runner, scripts/gpu_runner.sh) it is the
peer that people would write today: --precision bf16 runs the forward under bf16
autocast, --sdpa replaces the written-out attention with scaled_dot_product_attention
(is_causal), AdamW is the fused CUDA implementation, and --compile wraps the model in
torch.compile (its compilation happens in the warmup steps, which are not timed).

The last line is machine-readable:
  train_benchmark impl=torch ... tokens_per_s=X ms_per_step=Y ...
"""
import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference"))
import gpt_torch_reference as reference  # noqa: E402


def padded(vocab_size, multiple=128):
    return (vocab_size + multiple - 1) // multiple * multiple


def init_gpt2(model, n_layer, vocab_size):
    """GPT-2's initialisation, as dufu's GPT::init_gpt2 (with torch's RNG)."""
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                param.fill_(1.0)
            elif param.dim() == 1:
                param.zero_()
            elif name.endswith("attn.c_proj.weight") or name.endswith("mlp.c_proj.weight"):
                param.normal_(0.0, residual_std)
            else:
                param.normal_(0.0, 0.02)
        model.wte.weight[vocab_size:].zero_()  # the padding rows


class SdpaAttention(reference.Attention):
    """The reference attention through torch's fused kernel (torch 2.0 and later)."""

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--foreach", action="store_true",
                        help="AdamW's multi-tensor (foreach) implementation; 1.13's default is the per-tensor loop")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: the forward under torch.autocast(bfloat16), fp32 weights and optimizer")
    parser.add_argument("--sdpa", action="store_true", help="attention through scaled_dot_product_attention")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as dufu's fp32 recipe
    B, T, V = args.micro_batch, args.seq, args.vocab
    model = reference.GPT(args.n_layer, args.n_head, args.d_model, V, padded(V), T)
    if args.sdpa:
        for block in model.h:
            block.attn.__class__ = SdpaAttention
    init_gpt2(model, args.n_layer, V)
    model.to(device)
    model.train()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    fused = {"fused": True} if on_gpu else {"foreach": args.foreach}
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **fused)
    forward = torch.compile(model) if args.compile else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    rows = torch.randint(0, V, (B, T + 1), dtype=torch.int64).to(device)
    tokens, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    losses = []
    grad_norm = 0.0

    def step():
        nonlocal grad_norm
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            _, loss = forward(tokens, targets)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        optimizer.step()
        losses.append(loss.item())  # .item() waits for the step, like dufu's synchronous kernels

    start = time.perf_counter()
    for _ in range(args.warmup):
        step()
    warmup_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - start
    with torch.no_grad(), autocast:
        final_loss = forward(tokens, targets)[1].item()

    expected_first = math.log(V)
    if not math.isfinite(losses[0]) or abs(losses[0] - expected_first) > 0.5:
        sys.exit(f"torch_train_benchmark: first loss {losses[0]} is not close to ln(vocab) = {expected_first}")
    if not math.isfinite(final_loss) or not final_loss < losses[0]:
        sys.exit(f"torch_train_benchmark: loss did not fall on a repeated batch: {losses[0]} -> {final_loss}")

    tokens_per_step = B * T
    tokens_per_s = tokens_per_step * args.steps / seconds
    ms_per_step = 1e3 * seconds / args.steps
    n_params = sum(p.numel() for p in model.parameters())
    variant = f"{args.device} {args.precision}{' sdpa' if args.sdpa else ''}{' compiled' if args.compile else ''}"
    print(f"torch {torch.__version__} ({variant}) train step: n_layer {args.n_layer}, d_model {args.d_model}, "
          f"n_head {args.n_head}, vocab {V} (padded {padded(V)}), {n_params} parameters")
    print(f"  batch {B} x {T} = {tokens_per_step} tokens/step, {torch.get_num_threads()} threads, "
          f"{args.warmup} warmup steps ({warmup_seconds:.2f} s), {args.steps} timed steps ({seconds:.2f} s)")
    print(f"  loss {losses[0]:.4f} (ln V = {expected_first:.4f}) -> {final_loss:.4f} after {len(losses)} steps; "
          f"last gradient norm {grad_norm:.3f}")
    print(f"  {tokens_per_s:.1f} tokens/s, {ms_per_step:.1f} ms/step")
    print(f"train_benchmark impl=torch device={args.device} precision={args.precision} sdpa={int(args.sdpa)} "
          f"compile={int(args.compile)} n_layer={args.n_layer} d_model={args.d_model} n_head={args.n_head} "
          f"vocab={V} seq={T} micro_batch={B} threads={torch.get_num_threads()} warmup={args.warmup} "
          f"steps={args.steps} seconds={seconds:.3f} tokens_per_s={tokens_per_s:.2f} ms_per_step={ms_per_step:.1f} "
          f"loss_first={losses[0]:.4f} loss_final={final_loss:.4f}")


if __name__ == "__main__":
    main()
