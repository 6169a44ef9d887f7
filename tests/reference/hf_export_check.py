#!/usr/bin/env python3
"""transformers against a `train export-hf` directory (tests/trainer/export_hf_test.cc).

Runs in the venv of scripts/setup_reference_venv.sh --transformers (transformers 4.47.1
over Debian's torch 1.13).

  check --export DIR --expected FILE.json
      Loads DIR with GPT2LMHeadModel.from_pretrained and AutoTokenizer.from_pretrained
      and fails (exit 1, one line per failure) unless: loading logs no warning and
      reports no missing, unexpected or mismatched weight; the LM head is wte; the
      config has the expected shape and token ids; the loss of the batch is dufu's
      (relative 1e-5: fp32 summed in other orders); greedy generation gives dufu's
      tokens (and, when given, the text `train generate` printed); the tokenizer is of
      the expected class, has the model's vocabulary and encodes each text to dufu's
      ids. FILE.json holds what dufu computed: tokens, targets, loss, prompt, greedy,
      max_new_tokens, generate_text (or null), texts, encodings, tokenizer_class,
      use_fast, config (the expected config.json fields).

  loss --export DIR --batch FILE.json [--device cuda] [--tolerance R]
      The GPU runner's loss parity (scripts/gpu_runner.sh): loads DIR on the device and
      fails unless the loss of the batch in FILE.json (train_benchmark --save-initial's
      first_batch.json: tokens, targets, micro_batch, seq, precision, loss) is dufu's
      within R relative (default 1e-5 for fp32, 1e-2 for bf16, whose forward then runs
      under torch.autocast(bfloat16)). fp32 matmuls are kept out of TF32.

  make-bytelevel OUT_DIR
      Trains a small byte-level BPE with HuggingFace tokenizers (GPT-2's layout:
      ByteLevel pre-tokenizer and decoder, <|endoftext|> as a special token) on fixed
      text and writes it as OUT_DIR/tokenizer.json and as OUT_DIR/vocab.json +
      OUT_DIR/merges.txt.
"""
import argparse
import json
import logging
import os
import sys
import warnings

LOSS_REL_TOLERANCE = 1e-5


class Failures:
    def __init__(self):
        self.lines = []

    def check(self, ok, message):
        if not ok:
            self.lines.append(message)
        return ok


class CapturedWarnings(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def batch_loss(model, tokens, targets):
    """The mean next-token cross-entropy of one batch, as dufu's forward computes it."""
    import torch

    with torch.no_grad():
        logits = model(tokens).logits.float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-1).item()


def loss_parity(args):
    import torch
    from transformers import GPT2LMHeadModel

    with open(args.batch, encoding="utf-8") as f:
        batch = json.load(f)
    bf16 = batch["precision"] == "bf16"
    tolerance = args.tolerance if args.tolerance is not None else (1e-2 if bf16 else LOSS_REL_TOLERANCE)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = GPT2LMHeadModel.from_pretrained(args.export).float().to(device).eval()
    shape = (batch["micro_batch"], batch["seq"])
    tokens = torch.tensor(batch["tokens"], dtype=torch.long, device=device).reshape(shape)
    targets = torch.tensor(batch["targets"], dtype=torch.long, device=device).reshape(shape)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = batch_loss(model, tokens, targets)
    relative = abs(loss - batch["loss"]) / abs(batch["loss"])
    verdict = "OK" if relative <= tolerance else "FAIL"
    print(f"loss parity {batch['precision']} on {device}: transformers {loss:.8f} dufu {batch['loss']:.8f} "
          f"rel err {relative:.3e} (tolerance {tolerance:g}) {verdict}")
    if verdict != "OK":
        sys.exit(1)


def check(args):
    import torch
    import transformers
    from transformers import AutoTokenizer, GPT2LMHeadModel

    with open(args.expected, encoding="utf-8") as f:
        expected = json.load(f)
    failures = Failures()

    transformers.logging.set_verbosity_warning()
    captured = CapturedWarnings()
    transformers.logging.get_logger().addHandler(captured)
    with warnings.catch_warnings(record=True) as python_warnings:
        warnings.simplefilter("always")
        model, info = GPT2LMHeadModel.from_pretrained(args.export, output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(args.export, use_fast=expected["use_fast"])
    transformers.logging.get_logger().removeHandler(captured)
    for message in captured.messages + [str(w.message) for w in python_warnings]:
        failures.check(False, f"loading logged a warning: {message}")
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        failures.check(not info[kind], f"from_pretrained {kind}: {info[kind]}")
    model.eval()
    failures.check(model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
                   "the LM head is not tied to wte")
    for key, value in expected["config"].items():
        actual = getattr(model.config, key)
        failures.check(actual == value, f"config.{key} is {actual!r}, expected {value!r}")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        actual = getattr(model.generation_config, key)
        failures.check(actual == expected["config"][key], f"generation_config.{key} is {actual!r}")

    tokens = torch.tensor(expected["tokens"], dtype=torch.long)
    targets = torch.tensor(expected["targets"], dtype=torch.long)
    loss = batch_loss(model, tokens, targets)
    relative = abs(loss - expected["loss"]) / abs(expected["loss"])
    print(f"loss: transformers {loss:.8f} dufu {expected['loss']:.8f} rel err {relative:.3e}")
    failures.check(relative <= LOSS_REL_TOLERANCE, f"loss {loss} differs from dufu's {expected['loss']}")

    prompt = torch.tensor([expected["prompt"]], dtype=torch.long)
    with torch.no_grad():
        # synced_gpus given: left as None, generate() imports torch.distributed.fsdp to
        # ask, which Debian's torch 1.13 cannot import under Python 3.11.
        output = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                max_new_tokens=expected["max_new_tokens"], synced_gpus=False)
    greedy = output[0, prompt.shape[1]:].tolist()
    print(f"greedy: transformers {greedy}")
    failures.check(greedy == expected["greedy"], f"greedy tokens {greedy} differ from dufu's {expected['greedy']}")
    if expected["generate_text"] is not None:
        continuation = [t for t in greedy if t != model.config.eos_token_id]
        text = tokenizer.decode(expected["prompt"] + continuation, skip_special_tokens=True)
        print(f"greedy text: {text!r}")
        failures.check(text == expected["generate_text"],
                       f"greedy text {text!r} differs from train generate's {expected['generate_text']!r}")

    failures.check(type(tokenizer).__name__ == expected["tokenizer_class"],
                   f"tokenizer class {type(tokenizer).__name__}, expected {expected['tokenizer_class']}")
    failures.check(len(tokenizer) == model.config.vocab_size,
                   f"the tokenizer has {len(tokenizer)} tokens, the model {model.config.vocab_size}")
    failures.check(tokenizer.eos_token_id == model.config.eos_token_id,
                   f"tokenizer eos {tokenizer.eos_token_id}, config {model.config.eos_token_id}")
    same = 0
    for text, ids in zip(expected["texts"], expected["encodings"]):
        encoded = tokenizer.encode(text)
        if failures.check(encoded == ids, f"encoding {text!r}: transformers {encoded}, dufu {ids}"):
            same += 1
    print(f"tokenizer {type(tokenizer).__name__}: {same} of {len(expected['texts'])} texts encode as dufu's")

    for line in failures.lines:
        print("FAIL:", line)
    if failures.lines:
        sys.exit(1)
    print("OK")


def make_bytelevel(args):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = [
        "The quick brown fox jumps over the lazy dog.",
        "Pack my box with five dozen liquor jugs!",
        "  Whitespace   runs,\ttabs\tand\nnewlines\n\nstay as they are.",
        "Numbers 12345 and 3.14159, symbols #@$%^&*() and ümlauts, çedillas, 日本語.",
        "def main(argc, argv):\n    return 0  # code too\n",
    ] * 20
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(text, trainer)
    os.makedirs(args.out_dir, exist_ok=True)
    tokenizer.save(os.path.join(args.out_dir, "tokenizer.json"))
    tokenizer.model.save(args.out_dir)  # vocab.json and merges.txt
    print(f"byte-level BPE with {tokenizer.get_vocab_size()} tokens in {args.out_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check")
    check_parser.add_argument("--export", required=True)
    check_parser.add_argument("--expected", required=True)
    loss_parser = commands.add_parser("loss")
    loss_parser.add_argument("--export", required=True)
    loss_parser.add_argument("--batch", required=True)
    loss_parser.add_argument("--device", default="cpu")
    loss_parser.add_argument("--tolerance", type=float)
    make_parser = commands.add_parser("make-bytelevel")
    make_parser.add_argument("out_dir")
    args = parser.parse_args()
    if args.command == "check":
        check(args)
    elif args.command == "loss":
        loss_parity(args)
    else:
        make_bytelevel(args)


if __name__ == "__main__":
    main()
