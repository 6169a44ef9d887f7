#!/usr/bin/env python3
"""Single-thread encode rates of the reference tokenizers on the texts of jsonl files,
for benchmarks/tokenizer_benchmark.sh: tiktoken's encode_ordinary (with the rank file
and the package's own pattern), bpe-openai and quicktok (the fastest exact encoders
published, when installed), HuggingFace tokenizers, sentencepiece's Encode. Best of
--passes passes, after a warm-up pass, in the thread's CPU time (as tokenizer_benchmark
measures). Prints one line per encoder:
  reference NAME text_mb_per_s=X tokens=T checksum=C
checksum: FNV-1a over every id in order, as tokenizer_benchmark prints it."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference"))
import tokenizer_reference  # noqa: E402


def checksum(all_ids):
    value = 14695981039346656037
    for ids in all_ids:
        for token in ids:
            value = ((value ^ token) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def measure(name, encode, texts, passes):
    all_ids = [encode(text) for text in texts]
    best = float("inf")
    for _ in range(passes):
        start = time.thread_time()
        for text in texts:
            encode(text)
        best = min(best, time.thread_time() - start)
    size = sum(len(text.encode()) for text in texts)
    print(f"reference {name} text_mb_per_s={size / best / 1e6:.3f} tokens={sum(map(len, all_ids))} "
          f"checksum={checksum(all_ids)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["tiktoken", "hf", "spm"])
    parser.add_argument("model")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--pattern")
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    texts = []
    for path in args.inputs:
        with open(path, encoding="utf-8") as source:
            texts.extend(json.loads(line)["text"] for line in source if line.strip())
    encoder = tokenizer_reference.Encoder(args.kind, args.model, pattern=args.pattern)
    if args.kind == "tiktoken":
        measure("tiktoken", encoder.encoding.encode_ordinary, texts, args.passes)
        encoding_name = {"cl100k": "cl100k_base", "o200k": "o200k_base"}.get(args.pattern)
        if encoding_name:
            try:
                import bpe_openai
                measure("bpe-openai", bpe_openai.get_encoding(encoding_name).encode_ordinary, texts, args.passes)
            except Exception as error:  # noqa: BLE001 - optional reference
                print(f"reference bpe-openai unavailable: {error}", file=sys.stderr)
            try:
                import quicktok
                measure("quicktok", quicktok.get_encoding(encoding_name).encode, texts, args.passes)
            except Exception as error:  # noqa: BLE001 - optional reference
                print(f"reference quicktok unavailable: {error}", file=sys.stderr)
    elif args.kind == "hf":
        measure("hf-tokenizers", encoder.encode, texts, args.passes)
    else:
        measure("sentencepiece", encoder.processor.encode_as_ids, texts, args.passes)


if __name__ == "__main__":
    main()
