#!/usr/bin/env python3
"""HuggingFace Llama's rotary position embedding, written out in torch: the oracle of
dufu's rotary_forward and rotary_backward kernels (tests/trainer/rope_torch_test.cc).

transformers lives in its own venv, so its formulas are copied here as
modeling_llama.py (LlamaRotaryEmbedding with the default rope type, rotate_half,
apply_rotary_pos_emb) has them, in float32: inv_freq = 1 / theta^(arange(0, hs, 2) / hs),
freqs = inv_freq x positions, emb = cat(freqs, freqs), q * cos + rotate_half(q) * sin.

Reads DIR/qkv.npy [B T, (NH + 2 NKV) hs] (NH query heads, NKV key heads, NKV value
heads per row) and DIR/w.npy of the same shape; writes DIR/rotated.npy (the buffer
with q and k turned, v as it was) and DIR/grad.npy, autograd's gradient of
sum(w * rotated) with respect to qkv.
"""
import argparse
import pathlib

import numpy as np
import torch


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def cos_sin(batch, seq, head_size, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.int64).to(dtype=torch.float) / head_size))
    position_ids = torch.arange(seq)[None, :].expand(batch, -1)
    inv_freq_expanded = inv_freq[None, :, None].float().expand(batch, -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--n-head", type=int, required=True)
    parser.add_argument("--n-kv-head", type=int, required=True)
    parser.add_argument("--head-size", type=int, required=True)
    parser.add_argument("--theta", type=float, required=True)
    args = parser.parse_args()
    directory = pathlib.Path(args.dir)
    nh, nkv, hs = args.n_head, args.n_kv_head, args.head_size

    rows, width = np.load(directory / "qkv.npy").shape
    batch, seq = args.batch, rows // args.batch
    qkv = torch.from_numpy(np.load(directory / "qkv.npy").reshape(batch, seq, width)).requires_grad_(True)
    w = torch.from_numpy(np.load(directory / "w.npy").reshape(batch, seq, width))
    assert width == (nh + 2 * nkv) * hs
    # The layout attention reads: [B, heads, T, hs].
    q = qkv[..., : nh * hs].reshape(batch, seq, nh, hs).transpose(1, 2)
    k = qkv[..., nh * hs : (nh + nkv) * hs].reshape(batch, seq, nkv, hs).transpose(1, 2)
    v = qkv[..., (nh + nkv) * hs :]
    cos, sin = cos_sin(batch, seq, hs, args.theta)
    q_embed, k_embed = apply_rotary_pos_emb(q, k, cos, sin)
    q_rows = q_embed.transpose(1, 2).reshape(batch, seq, nh * hs)
    k_rows = k_embed.transpose(1, 2).reshape(batch, seq, nkv * hs)
    rotated = torch.cat((q_rows, k_rows, v), dim=-1)
    (rotated * w).sum().backward()
    np.save(directory / "rotated.npy", rotated.detach().numpy().reshape(rows, width))
    np.save(directory / "grad.npy", qkv.grad.numpy().reshape(rows, width))


if __name__ == "__main__":
    main()
