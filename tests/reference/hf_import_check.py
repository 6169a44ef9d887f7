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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check_common import (add_commands, finish, gradient_error, loss_and_backward,  # noqa: E402
                             loss_failures, same_tensor_failures, save_with_batch, tensors_of)

CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def make(args):
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
    files = save_with_batch(model, args, config.vocab_size)
    print(f"saved {args.dtype} GPT2LMHeadModel to {args.out}: {', '.join(files)}")


def compare(args):
    import torch
    from safetensors.numpy import load_file
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(args.hf, torch_dtype=torch.float32).eval()
    hf_loss = loss_and_backward(model, args.hf)
    dufu = load_file(args.dufu)
    dufu_loss = float(dufu.pop("loss"))
    failures, relative = loss_failures(hf_loss, dufu_loss)
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
        seen.add(name)
        error = gradient_error(name, name, dufu[name], expected, vocab, name == "wte.weight", failures)
        worst = max(worst, error)
    for name in sorted(set(dufu) - seen):
        failures.append(f"dufu has a gradient of {name}, which transformers' model does not have")
    print(f"loss transformers {hf_loss:.8f} dufu {dufu_loss:.8f} (relative {relative:.2e}); "
          f"largest gradient difference {worst:.2e} of the tensor's largest value")
    finish(failures)


def same_tensors(args):
    original = tensors_of(args.hf, strip_prefix="transformer.")
    original.pop("lm_head.weight", None)
    exported = tensors_of(args.export, strip_prefix="transformer.")
    failures = same_tensor_failures(original, exported)
    print(f"{len(exported)} tensors compared")
    finish(failures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _, compare_parser = add_commands(parser, "same-tensors")
    compare_parser.add_argument("--dufu", required=True)
    args = parser.parse_args()
    {"make": make, "compare": compare, "same-tensors": same_tensors}[args.command](args)


if __name__ == "__main__":
    main()
