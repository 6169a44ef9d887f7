#!/usr/bin/env python3
"""Independent reference token ids: sentencepiece's own Python encoder
(python3-sentencepiece) applied to every document of a jsonl or txt file. Prints one
line per non-empty document: the ids separated by spaces, with the EOD id appended
when asked, in the order dataprep writes them.

usage: spm_encode_reference.py MODEL INPUT [--append-eod] [--key text] [--txt]
"""
import argparse
import json

import sentencepiece


def documents(path, key, txt):
    with open(path, encoding="utf-8", newline="\n") as source:
        for line in source:
            line = line[:-1] if line.endswith("\n") else line
            if txt:
                yield line[:-1] if line.endswith("\r") else line
            elif line.strip():
                yield json.loads(line)[key]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("input")
    parser.add_argument("--append-eod", action="store_true")
    parser.add_argument("--key", default="text")
    parser.add_argument("--txt", action="store_true")
    args = parser.parse_args()
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=args.model)
    for text in documents(args.input, args.key, args.txt):
        ids = tokenizer.encode_as_ids(text)
        if not ids:
            continue
        if args.append_eod:
            ids.append(tokenizer.eos_id())
        print(" ".join(map(str, ids)))


if __name__ == "__main__":
    main()
