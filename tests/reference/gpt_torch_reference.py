#!/usr/bin/env python3
"""GPT-2 written out in PyTorch: the oracle for dufu's GPT (tests/trainer/gpt_torch_test.cc).

The model follows HuggingFace's GPT2Model (same parameter names, Conv1D layers, pre-LN
blocks, tanh GELU, causal attention, final LayerNorm, LM head tied to wte) but is
written from scratch so that nothing beyond torch itself is needed. The vocabulary is
padded to Vp rows of wte; the padding is excluded from the loss (logits[..., :V]).

Everything is exchanged as .npy files in one directory (--dir):

  in   params/<name>.npy      every parameter in dufu's layout, float32. Matrices are
                              [out, in] there; HF's Conv1D weights are [in, out], so
                              the four Conv1D weights of each block are transposed here
                              on load, and their gradients transposed back on write.
  in   tokens.npy, targets.npy  int32 [B, T]; a target of -1 is ignored by the loss
  out  out/loss.npy           float32 [1]: mean cross-entropy over non-ignored targets
  out  out/logits.npy         float32 [B*T, Vp]: logits of the padded vocabulary
  out  out/grads/<name>.npy   gradient of that mean loss, dufu's layout
  out  out/adamw_losses.npy   float32 [steps]: the loss before each of `steps`
                              torch.optim.AdamW steps on the same batch

With --eod-id E and any of --reset-position-ids, --reset-attention-mask and
--eod-mask-loss (document masking), each row's position ids, attention mask and loss
mask come from its own tokens through Megatron's _get_ltor_masks_and_position_ids
(megatron_masks_reference.py), and the loss is the mean over the positions the loss
mask keeps (and whose target is not -1), as Megatron averages it.

--arch llama: the Llama family instead, written out the same way (RMSNorm, rotary
position embedding in HF's rotate_half convention, grouped K/V heads, SwiGLU, an
untied LM head), in dufu's names and HF's [out, in] matrices (--n-kv-head,
--rope-theta, --norm-eps).

Weight decay goes to the 2-D parameters only (every Conv1D weight, wte and wpe, as in
nanoGPT and llm.c); biases and LayerNorm parameters get none.
"""
import argparse
import math
import os

import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_masks_reference  # noqa: E402


class Conv1D(nn.Module):
    """HF's Conv1D: y = x @ weight + bias, weight stored [in, out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_tanh(x):
    # GPT-2's GELU, written out rather than F.gelu(approximate="tanh") so the formula
    # is visible next to the kernel it checks.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class Attention(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(d_model, 3 * d_model)
        self.c_proj = Conv1D(d_model, d_model)

    def forward(self, x, visible):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.c_fc = Conv1D(d_model, 4 * d_model)
        self.c_proj = Conv1D(4 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = Attention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model, eps=1e-5)
        self.mlp = MLP(d_model)

    def forward(self, x, visible, positions):
        del positions  # GPT-2's positions enter through wpe
        x = x + self.attn(self.ln_1(x), visible)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d_model, vocab_size, padded_vocab_size, seq_length):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(padded_vocab_size, d_model)
        self.wpe = nn.Embedding(seq_length, d_model)
        self.h = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)

    def forward(self, tokens, targets, documents=None):
        visible, positions, loss_mask = documents or plain_rows(tokens)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x, visible, positions)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied LM head
        return logits, masked_mean_loss(logits[..., : self.vocab_size], targets, loss_mask)


def masked_mean_loss(real, targets, loss_mask):
    """Mean cross-entropy over the positions whose loss mask is 1 and target not -1."""
    flat = targets.reshape(-1)
    losses = F.cross_entropy(real.reshape(-1, real.shape[-1]), flat.clamp(min=0), reduction="none")
    keep = loss_mask.reshape(-1) * (flat != -1).float()
    return (losses * keep).sum() / keep.sum().clamp(min=1.0)


class RMSNorm(nn.Module):
    def __init__(self, d_model, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(d_model))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, positions, theta):
    """HF Llama's rotary embedding (rotate_half) of x [B, heads, T, hs] at positions [B, T]."""
    hs = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
    angles = positions[:, None, :, None].float() * inv_freq  # [B, 1, T, hs/2]
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    half = hs // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin


class LlamaAttention(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, theta):
        super().__init__()
        self.n_head, self.n_kv_head, self.theta = n_head, n_kv_head, theta
        hs = d_model // n_head
        self.q_proj = nn.Linear(d_model, n_head * hs, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_head * hs, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_head * hs, bias=False)
        self.o_proj = nn.Linear(n_head * hs, d_model, bias=False)

    def forward(self, x, visible, positions):
        B, T, C = x.shape
        hs = C // self.n_head
        q = self.q_proj(x).view(B, T, self.n_head, hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        q, k = rotate(q, positions, self.theta), rotate(k, positions, self.theta)
        group = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~visible, float("-inf")).softmax(dim=-1)
        return self.o_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, d_model, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, hidden, theta, eps):
        super().__init__()
        self.ln_1 = RMSNorm(d_model, eps)
        self.attn = LlamaAttention(d_model, n_head, n_kv_head, theta)
        self.ln_2 = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, hidden)

    def forward(self, x, visible, positions):
        x = x + self.attn(self.ln_1(x), visible, positions)
        return x + self.mlp(self.ln_2(x))


class Llama(nn.Module):
    def __init__(self, n_layer, n_head, n_kv_head, d_model, hidden, vocab_size, padded_vocab_size, theta, eps):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(padded_vocab_size, d_model)
        self.h = nn.ModuleList(LlamaBlock(d_model, n_head, n_kv_head, hidden, theta, eps) for _ in range(n_layer))
        self.ln_f = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, padded_vocab_size, bias=False)

    def forward(self, tokens, targets, documents=None):
        visible, positions, loss_mask = documents or plain_rows(tokens)
        x = self.wte(tokens)
        for block in self.h:
            x = block(x, visible, positions)
        logits = self.lm_head(self.ln_f(x))
        return logits, masked_mean_loss(logits[..., : self.vocab_size], targets, loss_mask)


def plain_rows(tokens):
    """(visible [B, 1, T, T] bool, positions [B, T], loss mask [B, T]) of rows that are one
    sequence each: causal attention, positions 0..T-1, every target counted."""
    B, T = tokens.shape
    visible = torch.tril(torch.ones(T, T, dtype=torch.bool)).expand(B, 1, T, T)
    return visible, torch.arange(T).expand(B, T), torch.ones(B, T)


def batch_documents(tokens, args):
    """plain_rows, or with --eod-id Megatron's masks of each row."""
    B = tokens.shape[0]
    if args.eod_id is None:
        return plain_rows(tokens)
    rows = [megatron_masks_reference.ltor_masks_and_position_ids(tokens[b], args.eod_id, args.reset_position_ids,
                                                                 args.reset_attention_mask, args.eod_mask_loss)
            for b in range(B)]
    return (torch.stack([mask for mask, _, _ in rows]), torch.stack([pos for _, _, pos in rows]),
            torch.stack([loss for _, loss, _ in rows]))


def conv1d_weight_names(model):
    return {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, Conv1D)}


def load_params(model, params_dir):
    transposed = conv1d_weight_names(model)
    names = set()
    for name, param in model.named_parameters():
        array = np.load(os.path.join(params_dir, name + ".npy"))
        assert array.dtype == np.float32, f"{name}: dtype {array.dtype}, expected float32"
        if name in transposed:
            array = array.T
        assert array.shape == tuple(param.shape), f"{name}: shape {array.shape}, expected {tuple(param.shape)}"
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(array)))
        names.add(name)
    files = {f[: -len(".npy")] for f in os.listdir(params_dir) if f.endswith(".npy")}
    assert files == names, f"parameters not in the model: {sorted(files - names)}; missing: {sorted(names - files)}"


def save(path, array):
    np.save(path, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--n-head", type=int, required=True)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--n-kv-head", type=int)
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--norm-eps", type=float, default=1e-5)
    parser.add_argument("--eod-id", type=int)
    parser.add_argument("--reset-position-ids", action="store_true")
    parser.add_argument("--reset-attention-mask", action="store_true")
    parser.add_argument("--eod-mask-loss", action="store_true")
    args = parser.parse_args()

    params_dir = os.path.join(args.dir, "params")
    wte = np.load(os.path.join(params_dir, "wte.weight.npy"), mmap_mode="r")
    n_layer = sum(1 for f in os.listdir(params_dir) if f.endswith(".ln_1.weight.npy"))
    if args.arch == "llama":
        hidden = np.load(os.path.join(params_dir, "h.0.mlp.gate_proj.weight.npy"), mmap_mode="r").shape[0]
        model = Llama(n_layer, args.n_head, args.n_kv_head or args.n_head, wte.shape[1], hidden, args.vocab_size,
                      wte.shape[0], args.rope_theta, args.norm_eps)
    else:
        wpe = np.load(os.path.join(params_dir, "wpe.weight.npy"), mmap_mode="r")
        model = GPT(n_layer, args.n_head, wte.shape[1], args.vocab_size, wte.shape[0], wpe.shape[0])
    load_params(model, params_dir)

    tokens = torch.from_numpy(np.load(os.path.join(args.dir, "tokens.npy")).astype(np.int64))
    targets = torch.from_numpy(np.load(os.path.join(args.dir, "targets.npy")).astype(np.int64))
    documents = batch_documents(tokens, args)

    out_dir = os.path.join(args.dir, "out")
    grads_dir = os.path.join(out_dir, "grads")
    os.makedirs(grads_dir, exist_ok=True)

    logits, loss = model(tokens, targets, documents)
    loss.backward()
    save(os.path.join(out_dir, "loss.npy"), [loss.item()])
    save(os.path.join(out_dir, "logits.npy"), logits.detach().reshape(-1, logits.shape[-1]).numpy())
    transposed = conv1d_weight_names(model)
    for name, param in model.named_parameters():
        grad = param.grad.numpy()
        save(os.path.join(grads_dir, name + ".npy"), grad.T if name in transposed else grad)

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    losses = []
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(tokens, targets, documents)
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    save(os.path.join(out_dir, "adamw_losses.npy"), losses)


if __name__ == "__main__":
    main()
