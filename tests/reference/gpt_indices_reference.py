#!/usr/bin/env python3
"""Independent reference for dufu's causal-LM indices (docs/index-algorithms.md, sections 2-4).

Megatron-core GPTDataset's document, sample and shuffle indices, written plainly with
numpy only (numpy.random.RandomState does the shuffles), so the C++ test can require
bit-equal arrays. Nothing here is shared with the C++ code.

  gpt_indices_reference.py --sizes FILE --seq-length S [--num-samples N] [--seed 1234]
                           (--split 969,30,1 --part 0 | --begin B --end E) --out DIR
                           [--compare CACHE_DIR] [--order megatron|stable]

--order stable: dufu's stable order (issue 45; dataprep/src/datasets/stable_order.cc
says it in words): epoch e's documents shuffled by RandomState(seed + e * 0x9E3779B1
mod 2^32), which then shuffles the samples starting in epoch e (k*S in [e*T, (e+1)*T));
G epochs of samples, the fewest with ceil(G*T/S) >= N, over G + 1 epochs of documents.

FILE holds one sequence length per line; every sequence is its own document, as
Megatron's preprocessor writes them. Writes DIR/{document,sample,shuffle}_index.npy
and DIR/meta.txt (begin, end, epochs, separate_final_epoch, tokens, samples). With
--compare, also loads the same three files from CACHE_DIR (dufu's cache) with
numpy.load and exits non-zero unless dtype, shape and values all match.
"""

import argparse
import os
import re

import numpy as np

INT32_MAX = np.iinfo(np.int32).max


def split_bookends(split, num_elements):
    # Megatron's parse_and_normalize_split + get_split_indices.
    weights = [float(x) for x in re.findall(r"[.0-9]+", split)]
    weights += [0.0] * (3 - len(weights))
    weights = np.array(weights, dtype=np.float64)
    fractions = (weights / np.sum(weights)).tolist()
    bookends = [0]
    for fraction in fractions:
        bookends.append(bookends[-1] + int(round(fraction * float(num_elements))))
    excess = bookends[-1] - num_elements
    return [bookends[0]] + [b - excess for b in bookends[1:]]


def walk_samples(sizes, document_index, seq_length, num_samples):
    """Each sample takes seq_length + 1 tokens; the next starts on the last one taken."""
    rows = [(0, 0)]
    pos, off = 0, 0
    for _ in range(num_samples):
        need = seq_length + 1
        while True:
            take = min(int(sizes[document_index[pos]]) - off, need)
            need -= take
            off += take
            if need == 0:
                break
            pos += 1
            off = 0
        off -= 1  # step back onto the shared token
        rows.append((pos, off))
    return rows


def located_starts(sizes, document_index, seq_length, num_samples):
    """The same rows computed differently: sample k starts at stream token k * S."""
    lengths = sizes[document_index].astype(np.int64)
    ends = np.cumsum(lengths)
    starts = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    where = np.searchsorted(ends, starts, side="right")
    offsets = starts - (ends[where] - lengths[where])
    return list(zip(where.tolist(), offsets.tolist()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--seq-length", type=int, required=True)
    parser.add_argument("--num-samples", type=int)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--split")
    parser.add_argument("--part", type=int, default=0)
    parser.add_argument("--begin", type=int)
    parser.add_argument("--end", type=int)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare")
    parser.add_argument("--order", choices=["megatron", "stable"], default="megatron")
    args = parser.parse_args()

    with open(args.sizes) as f:
        sizes = np.array([int(line) for line in f if line.strip()], dtype=np.int64)
    if args.split is not None:
        bookends = split_bookends(args.split, len(sizes))
        begin, end = bookends[args.part], bookends[args.part + 1]
    else:
        begin, end = args.begin, args.end
    documents = np.arange(begin, end, dtype=np.int64)
    seq_length = args.seq_length

    tokens = int(np.sum(sizes[documents]))
    if args.order == "stable":
        document_index, sample_index, shuffle_index, epochs, num_samples = stable_order(
            sizes, documents, tokens, seq_length, args.num_samples, args.seed)
        separate = False
        return finish(args, begin, end, epochs, separate, tokens, num_samples, document_index, sample_index,
                      shuffle_index)
    epochs = 1
    if args.num_samples is not None:
        while epochs * tokens < args.num_samples * seq_length + 1:
            epochs += 1

    separate = False
    if epochs > 1:
        before_final = ((epochs - 1) * tokens - 1) // seq_length
        per_epoch = (tokens - 1) // seq_length
        separate = args.num_samples - before_final < int(0.80 * per_epoch)

    rng = np.random.RandomState(args.seed)
    if separate:
        first = np.tile(documents, epochs - 1).astype(np.int32)
        rng.shuffle(first)
        last = documents.astype(np.int32)
        rng.shuffle(last)
        document_index = np.concatenate((first, last))
    else:
        document_index = np.tile(documents, epochs).astype(np.int32)
        rng.shuffle(document_index)

    num_samples = (epochs * tokens - 1) // seq_length
    rows = walk_samples(sizes, document_index, seq_length, num_samples)
    if np.all(sizes > 0):
        assert rows == located_starts(sizes, document_index, seq_length, num_samples)
    wide = max(len(document_index), int(sizes.max())) > INT32_MAX
    sample_index = np.array(rows, dtype=np.int64 if wide else np.int32).reshape(num_samples + 1, 2)

    shuffle_dtype = np.int64 if num_samples >= np.iinfo(np.uint32).max - 1 else np.uint32
    first_part = ((epochs - 1) * tokens - 1) // seq_length if separate else num_samples
    shuffle_first = np.arange(0, first_part, dtype=shuffle_dtype)
    rng.shuffle(shuffle_first)
    shuffle_last = np.arange(first_part, num_samples, dtype=shuffle_dtype)
    if len(shuffle_last) > 0:
        rng.shuffle(shuffle_last)
    shuffle_index = np.concatenate((shuffle_first, shuffle_last))
    return finish(args, begin, end, epochs, separate, tokens, num_samples, document_index, sample_index,
                  shuffle_index)


def index_dtypes(sizes, document_index, num_samples):
    wide = max(len(document_index), int(sizes.max())) > INT32_MAX
    return (np.int64 if wide else np.int32,
            np.int64 if num_samples >= np.iinfo(np.uint32).max - 1 else np.uint32)


def stable_order(sizes, documents, tokens, seq_length, wanted, seed):
    groups = 1 if wanted is None or wanted <= 1 else (wanted - 1) * seq_length // tokens + 1
    assert -(-groups * tokens // seq_length) >= (wanted or 0)
    epochs = groups + 1
    generators, parts = [], []
    for e in range(epochs):
        rng = np.random.RandomState((seed + e * 0x9E3779B1) % 2**32)
        part = documents.astype(np.int32)
        rng.shuffle(part)
        generators.append(rng)
        parts.append(part)
    document_index = np.concatenate(parts)
    num_samples = -(-groups * tokens // seq_length)
    rows = walk_samples(sizes, document_index, seq_length, num_samples)
    if np.all(sizes > 0):
        assert rows == located_starts(sizes, document_index, seq_length, num_samples)
    sample_dtype, shuffle_dtype = index_dtypes(sizes, document_index, num_samples)
    sample_index = np.array(rows, dtype=sample_dtype).reshape(num_samples + 1, 2)
    pieces = []
    for e in range(groups):
        first, end = -(-e * tokens // seq_length), -(-(e + 1) * tokens // seq_length)
        piece = np.arange(first, end, dtype=shuffle_dtype)
        generators[e].shuffle(piece)
        pieces.append(piece)
    return document_index, sample_index, np.concatenate(pieces), epochs, num_samples


def finish(args, begin, end, epochs, separate, tokens, num_samples, document_index, sample_index, shuffle_index):
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "document_index.npy"), document_index)
    np.save(os.path.join(args.out, "sample_index.npy"), sample_index)
    np.save(os.path.join(args.out, "shuffle_index.npy"), shuffle_index)
    with open(os.path.join(args.out, "meta.txt"), "w") as f:
        f.write(f"begin {begin}\nend {end}\nepochs {epochs}\nseparate {int(separate)}\n"
                f"tokens {tokens}\nsamples {num_samples}\n")

    if args.compare is not None:
        ours = {"document_index.npy": document_index, "sample_index.npy": sample_index,
                "shuffle_index.npy": shuffle_index}
        for name, expected in ours.items():
            theirs = np.load(os.path.join(args.compare, name))
            if theirs.dtype != expected.dtype or theirs.shape != expected.shape or not (theirs == expected).all():
                raise SystemExit(f"{name}: dufu has {theirs.dtype} {theirs.shape}, numpy {expected.dtype} "
                                 f"{expected.shape}; first values {theirs.reshape(-1)[:8]} vs "
                                 f"{expected.reshape(-1)[:8]}")


if __name__ == "__main__":
    main()
