#!/usr/bin/env python3
"""transformers against `train import-hf` (tests/trainer/hf_import_test.sh).

Runs in the venv of scripts/setup_reference_venv.sh --transformers (transformers 4.47.1
over Debian's torch).

  make --out DIR [--max-shard-size SIZE] [--dtype float32|bfloat16|float16] [--seed N]
      A GPT2LMHeadModel with random weights (2 layers, n_embd 64, 4 heads, vocab 300:
      hf_export_check.py make-bytelevel's tokenizer's, n_positions 32; every weight,
      LayerNorms and biases included, drawn at random so no tensor is trivially 0 or 1) saved by save_pretrained with safetensors, in
      shards of at most SIZE when given, and in DIR/batch.bin a batch of 2 x 16 token
      ids then its targets (int32, the last target of row 1 -1: ignored), from the seed.

  compare --hf DIR --dufu FILE.safetensors
      The loss and gradients transformers computes on DIR/batch.bin (fp32, the mean
      cross-entropy over the non-ignored targets) against dufu's in FILE ("loss" and
      each gradient under dufu's name and layout: Conv1D weights [out, in], wte with
      its padding rows, which must be 0): fails (exit 1) unless the loss is within 1e-5
      relative and every gradient within 1e-4 of its tensor's largest value.

  same-tensors --hf DIR --export DIR2
      Fails unless DIR2 (export-hf of the imported checkpoint) holds every weight of DIR
      bit for bit, under GPT2Model names, and nothing else (the tied lm_head aside).
"""
import argparse
import json
import os
import sys

LOSS_REL_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-4
B, T = 2, 16
CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def make(args):
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            scale = 0.2 if name.endswith(".weight") and parameter.dim() == 2 else 0.1
            offset = 1.0 if (".ln_" in name or "ln_f" in name) and name.endswith(".weight") else 0.0
            parameter.copy_(offset + scale * torch.randn_like(parameter))
    model = model.to(getattr(torch, args.dtype))
    kwargs = {"safe_serialization": True}
    if args.max_shard_size:
        kwargs["max_shard_size"] = args.max_shard_size
    model.save_pretrained(args.out, **kwargs)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, config.vocab_size, size=(B, T), dtype=np.int32)
    targets = np.concatenate([tokens[:, 1:], rng.integers(0, config.vocab_size, size=(B, 1), dtype=np.int32)], 1)
    targets[1, -1] = -1
    np.concatenate([tokens.ravel(), targets.ravel()]).astype("<i4").tofile(os.path.join(args.out, "batch.bin"))
    files = sorted(f for f in os.listdir(args.out) if f.endswith(".safetensors"))
    print(f"saved {args.dtype} GPT2LMHeadModel to {args.out}: {', '.join(files)}")


def compare(args):
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(args.hf, torch_dtype=torch.float32).eval()
    batch = np.fromfile(os.path.join(args.hf, "batch.bin"), dtype="<i4")
    tokens = torch.tensor(batch[:B * T].reshape(B, T), dtype=torch.long)
    targets = torch.tensor(batch[B * T:].reshape(B, T), dtype=torch.long)
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-1)
    loss.backward()
    dufu = load_file(args.dufu)
    failures = []
    dufu_loss = float(dufu.pop("loss"))
    relative = abs(loss.item() - dufu_loss) / abs(loss.item())
    if not relative <= LOSS_REL_TOLERANCE:
        failures.append(f"loss: transformers {loss.item():.8f}, dufu {dufu_loss:.8f} (relative {relative:.2e})")
    vocab = model.config.vocab_size
    worst = 0.0
    seen = set()
    for name, parameter in model.transformer.named_parameters():
        expected = parameter.grad.numpy()
        if name.endswith(CONV1D):
            expected = expected.T
        if name not in dufu:
            failures.append(f"dufu has no gradient of {name}")
            continue
        got = dufu[name]
        seen.add(name)
        if name == "wte.weight":
            if np.any(got[vocab:] != 0):
                failures.append("the padding rows of dufu's wte gradient are not 0")
            got = got[:vocab]
        if got.shape != expected.shape:
            failures.append(f"{name}: dufu's gradient has shape {got.shape}, transformers' {expected.shape}")
            continue
        error = float(np.max(np.abs(got - expected)) / max(float(np.max(np.abs(expected))), 1e-30))
        worst = max(worst, error)
        if not error <= GRAD_TOLERANCE:
            failures.append(f"{name}: gradient differs by {error:.2e} of its largest value")
    for name in sorted(set(dufu) - seen):
        failures.append(f"dufu has a gradient of {name}, which transformers' model does not have")
    print(f"loss transformers {loss.item():.8f} dufu {dufu_loss:.8f} (relative {relative:.2e}); "
          f"largest gradient difference {worst:.2e} of the tensor's largest value")
    for line in failures:
        print("FAIL:", line)
    sys.exit(1 if failures else 0)


def tensors_of(directory):
    from safetensors.torch import load_file  # numpy has no bfloat16

    index = os.path.join(directory, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if not os.path.exists(os.path.join(directory, files[0])):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for name in files:
        for key, value in load_file(os.path.join(directory, name)).items():
            tensors[key.removeprefix("transformer.")] = value
    return tensors


def same_tensors(args):
    original = tensors_of(args.hf)
    original.pop("lm_head.weight", None)
    exported = tensors_of(args.export)
    failures = []
    for name in sorted(set(original) | set(exported)):
        if name not in exported:
            failures.append(f"the export has no {name}")
        elif name not in original:
            failures.append(f"the export has {name}, the original not")
        else:
            a, b = original[name], exported[name]
            # The export is fp32; an fp32 original must match bit for bit, a BF16 or
            # F16 one widened exactly (torch's widening is exact).
            if a.dtype != b.dtype:
                a = a.to(b.dtype)
            if a.shape != b.shape or a.numpy().tobytes() != b.numpy().tobytes():
                failures.append(f"{name} differs ({a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)})")
    print(f"{len(exported)} tensors compared")
    for line in failures:
        print("FAIL:", line)
    sys.exit(1 if failures else 0)


def main():
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make_parser = commands.add_parser("make")
    make_parser.add_argument("--out", required=True)
    make_parser.add_argument("--max-shard-size")
    make_parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    make_parser.add_argument("--seed", type=int, default=3)
    compare_parser = commands.add_parser("compare")
    compare_parser.add_argument("--hf", required=True)
    compare_parser.add_argument("--dufu", required=True)
    same_parser = commands.add_parser("same-tensors")
    same_parser.add_argument("--hf", required=True)
    same_parser.add_argument("--export", required=True)
    args = parser.parse_args()
    {"make": make, "compare": compare, "same-tensors": same_tensors}[args.command](args)


if __name__ == "__main__":
    main()
