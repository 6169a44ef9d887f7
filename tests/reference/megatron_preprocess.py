#!/usr/bin/env python3
"""Independent reference for `dataprep preprocess`: what Megatron-LM's
tools/preprocess_data.py writes for `--tokenizer-type GPTSentencePieceTokenizer
--append-eod` on a jsonl file, re-expressed with python3-sentencepiece and numpy.

It follows Megatron-core's IndexedDatasetBuilder and _IndexWriter: json.loads per
line, encode_as_ids per document, EOD (the model's </s>) appended to non-empty
documents, optimal dtype uint16 when the vocab is < 65500 else int32, and the MMIDIDX
index (magic, version 1, u8 dtype code, u64 sequence count, u64 document count,
int32 lengths, int64 byte pointers, int64 document indices). Like Megatron, an empty
document still closes a document entry, so compare only inputs without empty ones.

usage: megatron_preprocess.py MODEL INPUT.jsonl OUTPUT_PREFIX [--append-eod] [--key text]
"""
import argparse
import json
import struct

import numpy
import sentencepiece

DTYPE_CODES = {numpy.uint16: 8, numpy.int32: 4}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("input")
    parser.add_argument("output_prefix")
    parser.add_argument("--append-eod", action="store_true")
    parser.add_argument("--key", default="text")
    args = parser.parse_args()

    tokenizer = sentencepiece.SentencePieceProcessor(model_file=args.model)
    vocab_size = len(tokenizer)
    dtype = numpy.uint16 if vocab_size < 65500 else numpy.int32
    eod = tokenizer.eos_id()

    sequence_lengths = []
    document_indices = [0]
    with open(args.input, encoding="utf-8") as source, open(args.output_prefix + ".bin", "wb") as bin_file:
        for line in source:
            if not line.strip():
                continue
            text = json.loads(line)[args.key]
            ids = tokenizer.encode_as_ids(text)
            lengths = []
            if len(ids) > 0:
                lengths.append(len(ids))
            if len(ids) > 0 and args.append_eod:
                ids.append(eod)
                lengths[-1] += 1
            bin_file.write(numpy.array(ids, dtype=dtype).tobytes(order="C"))
            sequence_lengths.extend(lengths)
            document_indices.append(len(sequence_lengths))

    itemsize = numpy.int64(numpy.dtype(dtype).itemsize)
    pointers = []
    current = numpy.int64(0)
    for length in sequence_lengths:
        pointers.append(current.item())
        current += length * itemsize

    with open(args.output_prefix + ".idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00")
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", DTYPE_CODES[dtype]))
        idx.write(struct.pack("<Q", len(sequence_lengths)))
        idx.write(struct.pack("<Q", len(document_indices)))
        idx.write(numpy.array(sequence_lengths, dtype=numpy.int32).tobytes(order="C"))
        idx.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
        idx.write(numpy.array(document_indices, dtype=numpy.int64).tobytes(order="C"))


if __name__ == "__main__":
    main()
