#!/usr/bin/env python3
"""Loss of a dufu checkpoint's model.safetensors in HF's GPT-2 layout (tests/trainer/checkpoint_test.cc).

The file is parsed here with struct/json/numpy (no safetensors package needed) and
its tensors are copied by name, untouched, into the PyTorch GPT-2 of
gpt_torch_reference.py, whose Conv1D layers take [in, out] weights as HF's do. If
dufu wrote a Conv1D weight untransposed, cut wte wrongly or misnamed a tensor, this
loss differs from the one dufu computes with its own model.

  --checkpoint DIR           holds model.safetensors
  --tokens, --targets .npy   int32 [B, T]; a target of -1 is ignored
  --n-head N                 the one shape not visible in the tensors
  --out FILE.npy             float32 [1]: the mean cross-entropy (also printed)
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch_reference import GPT  # noqa: E402

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """(tensors by name, metadata) of a safetensors file, checking that the tensors tile the data."""
    with open(path, "rb") as f:
        data = f.read()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_size].decode("utf-8"))
    body = data[8 + header_size:]
    metadata = header.pop("__metadata__", {})
    tensors, covered = {}, 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, end = entry["data_offsets"]
        assert begin == covered, f"{name}: begins at {begin}, previous tensor ended at {covered}"
        array = np.frombuffer(body[begin:end], dtype=DTYPES[entry["dtype"]])
        tensors[name] = array.reshape(entry["shape"]).copy()
        covered = end
    assert covered == len(body), f"data section is {len(body)} bytes, tensors cover {covered}"
    return tensors, metadata


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--targets", required=True)
    parser.add_argument("--n-head", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    tensors, metadata = read_safetensors(os.path.join(args.checkpoint, "model.safetensors"))
    assert metadata.get("format") == "pt", f"metadata format is {metadata.get('format')!r}, HF expects 'pt'"
    vocab_size, d_model = tensors["wte.weight"].shape
    n_layer = sum(1 for name in tensors if name.endswith(".ln_1.weight"))
    seq_length = tensors["wpe.weight"].shape[0]
    model = GPT(n_layer, args.n_head, d_model, vocab_size, vocab_size, seq_length)
    params = dict(model.named_parameters())
    assert set(params) == set(tensors), (
        f"missing: {sorted(set(params) - set(tensors))}; unexpected: {sorted(set(tensors) - set(params))}")
    with torch.no_grad():
        for name, param in params.items():
            array = tensors[name]
            assert array.dtype == np.float32, f"{name}: dtype {array.dtype}"
            assert array.shape == tuple(param.shape), f"{name}: shape {array.shape}, HF's is {tuple(param.shape)}"
            param.copy_(torch.from_numpy(array))

    tokens = torch.from_numpy(np.load(args.tokens).astype(np.int64))
    targets = torch.from_numpy(np.load(args.targets).astype(np.int64))
    with torch.no_grad():
        _, loss = model(tokens, targets)
    print(f"loss {loss.item():.9g}")
    np.save(args.out, np.array([loss.item()], dtype=np.float32), allow_pickle=False)


if __name__ == "__main__":
    main()
