"""What hf_import_check.py (GPT2LMHeadModel) and hf_llama_check.py (LlamaForCausalLM) share.

Saving a random model with its batch, transformers' loss and gradients on that batch,
the comparison of one gradient with dufu's, reading a saved directory's tensors and
comparing two such sets bit for bit, and the command line's common arguments. Runs in
the venv of scripts/setup_reference_venv.sh --transformers; torch, numpy and
safetensors are imported where used, so that --help works without them.
"""
import json
import os
import sys

LOSS_REL_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-4
B, T = 2, 16


def save_with_batch(model, args, vocab_size):
    """Saves `model` in args.dtype by save_pretrained with safetensors (in shards of at most
    args.max_shard_size when given) to args.out, and in args.out/batch.bin a batch of B x T
    token ids then its targets (int32, the last target of row 1 -1: ignored), drawn from
    args.seed. Returns the names of the .safetensors files written."""
    import numpy as np
    import torch

    model = model.to(getattr(torch, args.dtype))
    kwargs = {"safe_serialization": True}
    if args.max_shard_size:
        kwargs["max_shard_size"] = args.max_shard_size
    model.save_pretrained(args.out, **kwargs)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, vocab_size, size=(B, T), dtype=np.int32)
    targets = np.concatenate([tokens[:, 1:], rng.integers(0, vocab_size, size=(B, 1), dtype=np.int32)], 1)
    targets[1, -1] = -1
    np.concatenate([tokens.ravel(), targets.ravel()]).astype("<i4").tofile(os.path.join(args.out, "batch.bin"))
    return sorted(f for f in os.listdir(args.out) if f.endswith(".safetensors"))


def batch_of(directory):
    """The tokens and targets save_with_batch wrote into `directory`, as [B, T] torch tensors."""
    import numpy as np
    import torch

    batch = np.fromfile(os.path.join(directory, "batch.bin"), dtype="<i4")
    tokens = torch.tensor(batch[:B * T].reshape(B, T), dtype=torch.long)
    targets = torch.tensor(batch[B * T:].reshape(B, T), dtype=torch.long)
    return tokens, targets


def loss_and_backward(model, directory):
    """transformers' mean cross-entropy of `model` over the non-ignored targets of
    directory/batch.bin, after its backward (the gradients are in the parameters)."""
    import torch

    tokens, targets = batch_of(directory)
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-1)
    loss.backward()
    return loss.item()


def loss_failures(hf_loss, dufu_loss):
    """The loss's failure lines (none or one) and the relative difference."""
    relative = abs(hf_loss - dufu_loss) / abs(hf_loss)
    if not relative <= LOSS_REL_TOLERANCE:
        return [f"loss: transformers {hf_loss:.8f}, dufu {dufu_loss:.8f} (relative {relative:.2e})"], relative
    return [], relative


def gradient_error(name, dufu_name, got, expected, vocab, padded, failures):
    """Compares dufu's gradient `got` of `name` with transformers' `expected`; where `padded`,
    `got` has rows past `vocab` that must be 0. Appends failure lines to `failures`; returns
    the difference relative to the tensor's largest value (0 where the shapes differ)."""
    import numpy as np

    if padded:
        if np.any(got[vocab:] != 0):
            failures.append(f"the padding rows of dufu's {dufu_name} gradient are not 0")
        got = got[:vocab]
    if got.shape != expected.shape:
        failures.append(f"{name}: dufu's gradient has shape {got.shape}, transformers' {expected.shape}")
        return 0.0
    error = float(np.max(np.abs(got - expected)) / max(float(np.max(np.abs(expected))), 1e-30))
    if not error <= GRAD_TOLERANCE:
        failures.append(f"{name}: gradient differs by {error:.2e} of its largest value")
    return error


def tensors_of(directory, strip_prefix=""):
    """Every tensor of a save_pretrained directory (one file or shards by the index), as
    torch tensors (numpy has no bfloat16), under its name less `strip_prefix`."""
    from safetensors.torch import load_file

    files = ["model.safetensors"]
    if not os.path.exists(os.path.join(directory, files[0])):
        with open(os.path.join(directory, "model.safetensors.index.json"), encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for name in files:
        for key, value in load_file(os.path.join(directory, name)).items():
            tensors[key.removeprefix(strip_prefix)] = value
    return tensors


def same_tensor_failures(original, exported):
    """Failure lines unless `exported` (an fp32 export) holds every tensor of `original` bit
    for bit, a BF16 or F16 original widened exactly (torch's widening is), and nothing else."""
    failures = []
    for name in sorted(set(original) | set(exported)):
        if name not in exported:
            failures.append(f"the export has no {name}")
        elif name not in original:
            failures.append(f"the export has {name}, the original not")
        else:
            a, b = original[name], exported[name]
            if a.dtype != b.dtype:
                a = a.to(b.dtype)
            if a.shape != b.shape or a.numpy().tobytes() != b.numpy().tobytes():
                failures.append(f"{name} differs ({a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)})")
    return failures


def finish(failures):
    """Prints the failure lines and exits 1 if there are any, else 0."""
    for line in failures:
        print("FAIL:", line)
    sys.exit(1 if failures else 0)


def add_commands(parser, export_command):
    """Quiets transformers' progress bars and adds to `parser` the sub-commands make and
    compare with their common arguments, and `export_command` with --hf and --export;
    returns make's parser and compare's."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    commands = parser.add_subparsers(dest="command", required=True)
    make_parser = commands.add_parser("make")
    make_parser.add_argument("--out", required=True)
    make_parser.add_argument("--max-shard-size")
    make_parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    make_parser.add_argument("--seed", type=int, default=3)
    compare_parser = commands.add_parser("compare")
    compare_parser.add_argument("--hf", required=True)
    export_parser = commands.add_parser(export_command)
    export_parser.add_argument("--hf", required=True)
    export_parser.add_argument("--export", required=True)
    return make_parser, compare_parser
