#!/usr/bin/env python3
"""transformers' LlamaForCausalLM against `train import-hf` / `export-hf` (tests/trainer/hf_llama_test.sh).

Runs in the venv of scripts/setup_reference_venv.sh --transformers (transformers 4.47.1
over Debian's torch).

  make --out DIR --kv-heads N [--tie] [--max-shard-size SIZE] [--dtype D] [--seed N]
      A LlamaForCausalLM with random weights (2 layers, hidden 256, 8 heads, N K/V
      heads, intermediate 512, vocab 300: hf_export_check.py make-bytelevel's
      tokenizer's, 32 positions, rope_theta 500000, rms_norm_eps 1e-5, an untied head
      unless --tie; every weight drawn at random, the RMSNorm weights around 1) saved
      by save_pretrained with safetensors, in shards of at most SIZE when given, and in
      DIR/batch.bin a batch of 2 x 16 token ids then its targets (int32, the last
      target of row 1 -1: ignored), from the seed.

  compare --hf DIR --dufu FILE.safetensors [FILE.safetensors...]
      The loss and gradients transformers computes on DIR/batch.bin (fp32, the mean
      cross-entropy over the non-ignored targets) against dufu's in each FILE ("loss"
      and each gradient under dufu's name and layout, wte and lm_head with their
      padding rows, which must be 0): fails (exit 1) unless the loss is within 1e-5
      relative and every gradient within 1e-4 of its tensor's largest value.

  export --hf DIR --export DIR2
      DIR2 (export-hf of the imported checkpoint) holds every tensor of DIR under the
      same name bit for bit (a BF16 or F16 original widened exactly) and nothing else;
      LlamaForCausalLM.from_pretrained(DIR2) reports no missing, unexpected or
      mismatched keys, has DIR's config values, and computes DIR's logits on
      DIR/batch.bin exactly; fails otherwise.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check_common import (add_commands, batch_of, finish, gradient_error, loss_and_backward,  # noqa: E402
                             loss_failures, same_tensor_failures, save_with_batch, tensors_of)

VOCAB = 300


def dufu_to_hf(name):
    """dufu's llama tensor name -> LlamaForCausalLM's (written out here, not taken from dufu)."""
    if name == "wte.weight":
        return "model.embed_tokens.weight"
    if name == "ln_f.weight":
        return "model.norm.weight"
    if name == "lm_head.weight":
        return name
    _, layer, rest = name.split(".", 2)
    rest = {"ln_1.weight": "input_layernorm.weight", "ln_2.weight": "post_attention_layernorm.weight"}.get(rest, rest)
    if rest.startswith("attn."):
        rest = "self_attn." + rest[len("attn."):]
    return f"model.layers.{layer}.{rest}"


def make(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    config = LlamaConfig(hidden_size=256, num_attention_heads=8, num_key_value_heads=args.kv_heads,
                         intermediate_size=512, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=32,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=args.tie,
                         attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.copy_(0.05 * torch.randn_like(parameter))
    files = save_with_batch(model, args, VOCAB)
    print(f"saved {args.dtype} LlamaForCausalLM ({args.kv_heads} K/V heads, "
          f"{'tied' if args.tie else 'untied'} head) to {args.out}: {', '.join(files)}")


def load(directory):
    import torch
    from transformers import LlamaForCausalLM

    # eager: the attention transformers computes by its own formula, not torch's sdpa.
    return LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, attn_implementation="eager",
                                            output_loading_info=True)


def compare(args):
    model, _ = load(args.hf)
    model.eval()
    hf_loss = loss_and_backward(model, args.hf)
    failures = []
    for path in args.dufu:
        failures += compare_one(model, hf_loss, path)
    finish(failures)


def compare_one(model, hf_loss, path):
    from safetensors.numpy import load_file

    dufu = load_file(path)
    dufu_loss = float(dufu.pop("loss"))
    failures, relative = loss_failures(hf_loss, dufu_loss)
    expected_by_name = {name: p.grad.numpy() for name, p in model.named_parameters()}
    worst, worst_name = 0.0, ""
    for dufu_name in sorted(dufu):
        got = dufu[dufu_name]
        name = dufu_to_hf(dufu_name)
        if name not in expected_by_name:
            failures.append(f"dufu has a gradient of {dufu_name} ({name}), which transformers' model does not have")
            continue
        expected = expected_by_name.pop(name)
        padded = dufu_name in ("wte.weight", "lm_head.weight")
        error = gradient_error(name, dufu_name, got, expected, VOCAB, padded, failures)
        if error > worst:
            worst, worst_name = error, name
    for name in sorted(expected_by_name):
        failures.append(f"dufu has no gradient of {name}")
    print(f"{os.path.basename(path)}: loss transformers {hf_loss:.8f} dufu {dufu_loss:.8f} (relative "
          f"{relative:.2e}); largest gradient difference {worst:.2e} of the tensor's largest value ({worst_name})")
    return [f"{os.path.basename(path)}: {line}" for line in failures]


def export(args):
    import torch

    failures = same_tensors(args.hf, args.export)
    original, _ = load(args.hf)
    exported, info = load(args.export)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info[kind]:
            failures.append(f"from_pretrained's {kind}: {info[kind]}")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                "hidden_act", "rope_scaling", "attention_bias", "mlp_bias", "head_dim"):
        a, b = getattr(original.config, key), getattr(exported.config, key)
        if a != b:
            failures.append(f"config {key}: the original has {a!r}, the export {b!r}")
    tokens, _ = batch_of(args.hf)
    with torch.no_grad():
        a, b = original(tokens).logits, exported(tokens).logits
    difference = float((a - b).abs().max())
    if difference != 0.0:
        failures.append(f"the logits differ by up to {difference:.3e}")
    print(f"from_pretrained of {os.path.basename(args.export)}: logits differ by {difference:.1e}")
    finish(failures)


def same_tensors(hf, export):
    exported = tensors_of(export)
    failures = same_tensor_failures(tensors_of(hf), exported)
    print(f"{os.path.basename(export)}: {len(exported)} tensors compared bit for bit")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    make_parser, compare_parser = add_commands(parser, "export")
    make_parser.add_argument("--kv-heads", type=int, required=True)
    make_parser.add_argument("--tie", action="store_true")
    compare_parser.add_argument("--dufu", required=True, nargs="+")
    args = parser.parse_args()
    {"make": make, "compare": compare, "export": export}[args.command](args)


if __name__ == "__main__":
    main()
