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

Weight decay goes to the 2-D parameters only (every Conv1D weight, wte and wpe, as in
nanoGPT and llm.c); biases and LayerNorm parameters get none.
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


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

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
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

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d_model, vocab_size, padded_vocab_size, seq_length):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(padded_vocab_size, d_model)
        self.wpe = nn.Embedding(seq_length, d_model)
        self.h = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied LM head
        real = logits[..., : self.vocab_size]
        loss = F.cross_entropy(real.reshape(-1, real.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss


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
    args = parser.parse_args()

    params_dir = os.path.join(args.dir, "params")
    wte = np.load(os.path.join(params_dir, "wte.weight.npy"), mmap_mode="r")
    wpe = np.load(os.path.join(params_dir, "wpe.weight.npy"), mmap_mode="r")
    n_layer = sum(1 for f in os.listdir(params_dir) if f.endswith(".ln_1.weight.npy"))
    model = GPT(n_layer, args.n_head, wte.shape[1], args.vocab_size, wte.shape[0], wpe.shape[0])
    load_params(model, params_dir)

    tokens = torch.from_numpy(np.load(os.path.join(args.dir, "tokens.npy")).astype(np.int64))
    targets = torch.from_numpy(np.load(os.path.join(args.dir, "targets.npy")).astype(np.int64))

    out_dir = os.path.join(args.dir, "out")
    grads_dir = os.path.join(out_dir, "grads")
    os.makedirs(grads_dir, exist_ok=True)

    logits, loss = model(tokens, targets)
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
        _, loss = model(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    save(os.path.join(out_dir, "adamw_losses.npy"), losses)


if __name__ == "__main__":
    main()
