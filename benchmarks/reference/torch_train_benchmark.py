#!/usr/bin/python3
"""PyTorch's training throughput on one GPT shape: the baseline of benchmarks/train_benchmark.sh.

--arch llama swaps in the Llama of this file (LlamaModel below): RMSNorm, rotary
positions in HF's rotate_half convention, a SwiGLU MLP, grouped-query attention by
repeating each K/V head over its group of query heads (HF's repeat_kv), no biases, an
untied LM head; q, k, v in one projection and gate, up in another, as dufu holds them.

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


def llama_mlp_hidden(d_model, ffn_hidden):
    """dufu's GPTConfig::mlp_hidden for llama: int(2 * 4C / 3) rounded up to a multiple of 256."""
    return ffn_hidden if ffn_hidden > 0 else (2 * 4 * d_model // 3 + 255) // 256 * 256


class RMSNorm(torch.nn.Module):
    def __init__(self, d_model, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(torch.nn.Module):
    def __init__(self, d_model, n_head, n_kv_head):
        super().__init__()
        self.n_head, self.n_kv_head, self.hs = n_head, n_kv_head, d_model // n_head
        self.qkv = torch.nn.Linear(d_model, (n_head + 2 * n_kv_head) * self.hs, bias=False)
        self.o_proj = torch.nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        hs, nh, nkv = self.hs, self.n_head, self.n_kv_head
        q, k, v = self.qkv(x).split([nh * hs, nkv * hs, nkv * hs], dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nkv, hs).transpose(1, 2)
        v = v.view(B, T, nkv, hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if nkv != nh:  # query head h reads K/V head h // (nh / nkv)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.o_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class LlamaBlock(torch.nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, ffn_hidden, eps):
        super().__init__()
        self.input_norm = RMSNorm(d_model, eps)
        self.attn = LlamaAttention(d_model, n_head, n_kv_head)
        self.post_attention_norm = RMSNorm(d_model, eps)
        self.ffn_hidden = ffn_hidden
        self.gate_up = torch.nn.Linear(d_model, 2 * ffn_hidden, bias=False)
        self.down_proj = torch.nn.Linear(ffn_hidden, d_model, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        gate, up = self.gate_up(self.post_attention_norm(x)).split(self.ffn_hidden, dim=2)
        return x + self.down_proj(torch.nn.functional.silu(gate) * up)


class LlamaModel(torch.nn.Module):
    def __init__(self, n_layer, n_head, n_kv_head, d_model, vocab_size, padded_vocab, seq, ffn_hidden,
                 rope_theta=10000.0, eps=1e-5):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = torch.nn.Embedding(padded_vocab, d_model)
        self.h = torch.nn.ModuleList(
            LlamaBlock(d_model, n_head, n_kv_head, ffn_hidden, eps) for _ in range(n_layer))
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = torch.nn.Linear(d_model, padded_vocab, bias=False)
        hs = d_model // n_head
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)  # HF's layout: the pairs are (i, i + hs/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.wte(tokens)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        loss = torch.nn.functional.cross_entropy(
            logits[..., :self.vocab_size].reshape(-1, self.vocab_size), targets.reshape(-1), ignore_index=-1)
        return logits, loss


def init_llama(model, n_layer, vocab_size):
    """dufu's init_gpt2 under llama: RMSNorm weights 1, o_proj and down_proj like c_proj, the rest N(0, 0.02)."""
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.fill_(1.0)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                param.normal_(0.0, residual_std)
            else:
                param.normal_(0.0, 0.02)
        model.wte.weight[vocab_size:].zero_()
        model.lm_head.weight[vocab_size:].zero_()


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
    parser.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--n-kv-head", type=int, default=0, help="llama: key/value heads (0: --n-head)")
    parser.add_argument("--ffn-hidden", type=int, default=0, help="llama: SwiGLU width (0: Llama's 8/3 rule)")
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
    n_kv_head = args.n_kv_head or args.n_head
    ffn_hidden = llama_mlp_hidden(args.d_model, args.ffn_hidden)
    if args.arch == "llama":
        if args.sdpa:
            sys.exit("torch_train_benchmark: --sdpa is for --arch gpt2")
        model = LlamaModel(args.n_layer, args.n_head, n_kv_head, args.d_model, V, padded(V), T, ffn_hidden)
        init_llama(model, args.n_layer, V)
    else:
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
    print(f"torch {torch.__version__} ({variant}) train step: {args.arch}, n_layer {args.n_layer}, "
          f"d_model {args.d_model}, n_head {args.n_head}, n_kv_head {n_kv_head}, "
          f"MLP {ffn_hidden if args.arch == 'llama' else 4 * args.d_model}, vocab {V} (padded {padded(V)}), "
          f"{n_params} parameters")
    print(f"  batch {B} x {T} = {tokens_per_step} tokens/step, {torch.get_num_threads()} threads, "
          f"{args.warmup} warmup steps ({warmup_seconds:.2f} s), {args.steps} timed steps ({seconds:.2f} s)")
    print(f"  loss {losses[0]:.4f} (ln V = {expected_first:.4f}) -> {final_loss:.4f} after {len(losses)} steps; "
          f"last gradient norm {grad_norm:.3f}")
    print(f"  {tokens_per_s:.1f} tokens/s, {ms_per_step:.1f} ms/step")
    print(f"train_benchmark impl=torch device={args.device} precision={args.precision} sdpa={int(args.sdpa)} "
          f"compile={int(args.compile)} arch={args.arch} n_layer={args.n_layer} d_model={args.d_model} "
          f"n_head={args.n_head} n_kv_head={n_kv_head} vocab={V} seq={T} micro_batch={B} "
          f"threads={torch.get_num_threads()} warmup={args.warmup} "
          f"steps={args.steps} seconds={seconds:.3f} tokens_per_s={tokens_per_s:.2f} ms_per_step={ms_per_step:.1f} "
          f"loss_first={losses[0]:.4f} loss_final={final_loss:.4f}")


if __name__ == "__main__":
    main()
