#!/usr/bin/env python3
"""Single-thread encode rates of the reference tokenizers on the texts of jsonl files,
for benchmarks/tokenizer_benchmark.sh: tiktoken's encode_ordinary (with the rank file
and the package's own pattern), bpe-openai and quicktok (the fastest exact encoders
published, when installed), HuggingFace tokenizers (for a rank file: a tokenizer.json made
from it as transformers' TikTokenConverter makes one, cached in --hf-cache),
sentencepiece's Encode. Best of
--passes passes, after a warm-up pass, in the thread's CPU time (as tokenizer_benchmark
measures). Prints one line per encoder:
  reference NAME text_mb_per_s=X tokens=T checksum=C
checksum: FNV-1a over every id in order, as tokenizer_benchmark prints it."""
import argparse
import json
import os
import re
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


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 bytes, as HuggingFace's ByteLevel maps them."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, characters)))


def split_by_rank(ranks, token):
    """The two tokens that tiktoken's merges join into `token`: its bytes merged with
    every rank below the token's own (transformers' TikTokenConverter does the same)."""
    limit = ranks[token]
    parts = [bytes([byte]) for byte in token]
    while True:
        best = None
        for index in range(len(parts) - 1):
            rank = ranks.get(parts[index] + parts[index + 1])
            if rank is not None and rank < limit and (best is None or rank < best[0]):
                best = (rank, index)
        if best is None:
            return parts
        index = best[1]
        parts[index:index + 2] = [parts[index] + parts[index + 1]]


def hf_from_ranks(encoding, cache_dir):
    """A HuggingFace tokenizer equal to tiktoken's encode_ordinary: BPE over the ranks with
    ignore_merges (a piece that is a token is that token), tiktoken's pattern as an
    isolating Split, then ByteLevel without its own regex."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    path = os.path.join(cache_dir, f"{encoding.name}.hf-from-ranks.tokenizer.json") if cache_dir else None
    if path and os.path.exists(path):
        return Tokenizer.from_file(path)
    ranks = encoding._mergeable_ranks
    mapping = bytes_to_unicode()
    show = lambda token: "".join(mapping[byte] for byte in token)  # noqa: E731
    vocab = {show(token): rank for token, rank in ranks.items()}
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            parts = split_by_rank(ranks, token)
            if len(parts) != 2:
                raise SystemExit(f"tokenizer_reference_rate: rank {ranks[token]} is no merge of two tokens")
            merges.append((show(parts[0]), show(parts[1])))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    # tiktoken's possessive quantifiers (there for speed; the pieces are the same) are
    # something else in Oniguruma, where "{1,3}+" repeats "{1,3}": written plainly. And
    # Oniguruma's "$" is the end of a line, tiktoken's the end of the text: "\z".
    pattern = re.sub(r"(\?|\+|\*|\})\+", r"\1", encoding._pat_str).replace("$", r"\z")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tokenizer.save(path + ".tmp")
        os.replace(path + ".tmp", path)
    return tokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["tiktoken", "hf", "spm"])
    parser.add_argument("model")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--pattern")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--hf-cache", help="where the tokenizer.json made from a rank file is kept")
    parser.add_argument("--no-hf", action="store_true", help="leave HuggingFace tokenizers out for a rank file")
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
        if not args.no_hf:
            # One string at a time is one thread: batches are what tokenizers parallelizes.
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            hf = hf_from_ranks(encoder.encoding, args.hf_cache)
            measure("hf-tokenizers", lambda text: hf.encode(text, add_special_tokens=False).ids, texts, args.passes)
    elif args.kind == "hf":
        measure("hf-tokenizers", encoder.encode, texts, args.passes)
    else:
        measure("sentencepiece", encoder.processor.encode_as_ids, texts, args.passes)


if __name__ == "__main__":
    main()
