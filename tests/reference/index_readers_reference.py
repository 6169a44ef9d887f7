#!/usr/bin/env python3
"""Reads shards written by `dataprep preprocess` with the readers of Megatron and
fairseq and checks that every document equals python sentencepiece's encoding of the
input (plus the EOD id with --append-eod; documents empty after tokenization are
skipped, as dufu skips them).

Readers:
  megatron-core   Megatron-core's own IndexedDataset (megatron-core 0.16.1 from PyPI,
                  megatron/core/datasets/indexed_dataset.py), mmap=True and mmap=False:
                  for dufu's MMIDIDX (--impl mmap --layout megatron).
  megatron-legacy Megatron-LM's legacy IndexedDataset and IndexedCachedDataset, which are
                  not on PyPI: RE-EXPRESSED below from their published source
                  (NVIDIA/Megatron-LM megatron/data/indexed_dataset.py, read_index and
                  __getitem__): for dufu's TNTIDX (--impl lazy|cached --layout megatron).
  fairseq-mmap    fairseq's own reader code (fairseq 0.12.2's source distribution from
  fairseq-tntidx  PyPI: fairseq/data/indexed_dataset.py and data_utils.py) through
                  data_utils.load_indexed_dataset, the function fairseq's tasks load data
                  with (it passes fix_lua_indexing=True): --dataset-impl mmap, or lazy and
                  cached, and the impl it infers from the file; for dufu's --layout fairseq
                  with --impl mmap, or lazy|cached.

Both real packages come from `scripts/setup_reference_venv.sh --readers`; see
load_megatron_core and load_fairseq for the package __init__ files they skip.

usage: index_readers_reference.py MODEL INPUT.jsonl [--append-eod] [--key text]
           [--shard READER DTYPE PREFIX]... [--mismatch READER DTYPE PREFIX]...
--shard must read every document right; --mismatch must not (a reader given a layout
it was not written for, to show that the check can fail). Prints one line per shard;
exit status 0 when every expectation holds, else 1.
"""
import argparse
import functools
import importlib.util
import json
import os
import struct
import sys
import types

import numpy
import sentencepiece

# Where scripts/setup_reference_venv.sh --readers unpacks fairseq's source distribution.
FAIRSEQ_SOURCE = os.environ.get("DUFU_FAIRSEQ_SOURCE", os.path.join(sys.prefix, "fairseq-src"))


def expected_documents(model, path, key, append_eod):
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=model)
    documents = []
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            if not line.strip():
                continue
            ids = tokenizer.encode(json.loads(line)[key])
            if not ids:
                continue
            if append_eod:
                ids.append(tokenizer.eos_id())
            documents.append(ids)
    return documents


def stub_package(name, path):
    """A package module whose __init__.py is not run: its submodules import from `path`."""
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
    return module


@functools.cache
def load_megatron_core():
    # megatron/core/__init__.py imports the whole model stack (transformer-engine,
    # packaging, ...); the dataset reader needs none of it. parallel_state first: that
    # is the order in which the package's own __init__ imports utils and it.
    location = importlib.util.find_spec("megatron").submodule_search_locations[0]
    stub_package("megatron.core", os.path.join(location, "core"))
    import megatron.core.parallel_state  # noqa: F401
    from megatron.core.datasets import indexed_dataset
    return indexed_dataset


@functools.cache
def load_fairseq(source_root):
    # fairseq/__init__.py and fairseq/data/__init__.py import the whole toolkit (hydra,
    # omegaconf, compiled extensions that do not build against Debian's CPU torch);
    # indexed_dataset.py needs only FairseqDataset from the latter, and the Huffman
    # dataset (bitarray) only for impl "huffman", never used here.
    package = os.path.join(source_root, "fairseq")
    stub_package("fairseq", package)
    data = stub_package("fairseq.data", os.path.join(package, "data"))
    stub_package("fairseq.dataclass", os.path.join(package, "dataclass"))
    from fairseq.data.fairseq_dataset import FairseqDataset
    data.FairseqDataset = FairseqDataset
    huffman = types.ModuleType("fairseq.data.huffman")
    huffman.HuffmanMMapIndexedDataset = huffman.HuffmanMMapIndex = None
    sys.modules["fairseq.data.huffman"] = huffman
    from fairseq.data import data_utils, indexed_dataset
    return data_utils, indexed_dataset


class MegatronLegacyIndexedDataset:
    """Megatron-LM's legacy TNTIDX reader, re-expressed from its published source: a
    TNTIDX header with doc_count, then dim_offsets, data_offsets, sizes, doc_idx; item i
    is sizes[dim_offsets[i]:dim_offsets[i+1]] elements read at data_offsets[i] *
    element_size. Tokens are used as stored (Megatron dropped fairseq's id + 1)."""

    DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
              6: numpy.float64, 7: numpy.float64, 8: numpy.uint16}

    def __init__(self, prefix, cached):
        with open(prefix + ".idx", "rb") as stream:
            assert stream.read(8) == b"TNTIDX\x00\x00", "Index file doesn't match expected format"
            assert struct.unpack("<Q", stream.read(8)) == (1,)
            code, self.element_size = struct.unpack("<QQ", stream.read(16))
            self.dtype = self.DTYPES[code]
            self.length, s = struct.unpack("<QQ", stream.read(16))
            (doc_count,) = struct.unpack("<Q", stream.read(8))

            def longs(n):
                array = numpy.empty(n, dtype=numpy.int64)
                stream.readinto(array)
                return array

            self.dim_offsets = longs(self.length + 1)
            self.data_offsets = longs(self.length + 1)
            self.sizes = longs(s)
            self.doc_idx = longs(doc_count)
        self.data = open(prefix + ".bin", "rb", buffering=0)
        self.cache = None
        if cached:  # IndexedCachedDataset.prefetch of every item: one array in memory
            self.cache = numpy.empty(int(self.data_offsets[-1]), dtype=self.dtype)
            self.data.readinto(self.cache)

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        size = self.sizes[self.dim_offsets[i]:self.dim_offsets[i + 1]]
        if self.cache is not None:
            start = int(self.data_offsets[i])
            return self.cache[start:start + int(size.prod())].reshape(size)
        array = numpy.empty(size, dtype=self.dtype)
        self.data.seek(int(self.data_offsets[i]) * self.element_size)
        self.data.readinto(array)
        return array


def first_difference(name, expected, read_document, count, sizes):
    """None when the reader serves exactly `expected`, else what differs first."""
    if count != len(expected):
        return f"{name}: {count} items, expected {len(expected)} documents"
    for k, ids in enumerate(expected):
        got = [int(t) for t in read_document(k)]
        if got != ids:
            return f"{name}: document {k} reads {got[:12]}... ({len(got)} tokens), expected {ids[:12]}... ({len(ids)} tokens)"
        if sizes is not None and int(sizes[k]) != len(ids):
            return f"{name}: sizes[{k}] is {int(sizes[k])}, expected {len(ids)}"
    return None


def check_megatron_core(prefix, expected, dtype):
    indexed_dataset = load_megatron_core()
    for mmap in (True, False):
        name = f"megatron-core IndexedDataset(mmap={mmap})"
        dataset = indexed_dataset.IndexedDataset(prefix, mmap=mmap)
        if dtype and numpy.dtype(dataset.index.dtype) != numpy.dtype(dtype):
            return f"{name}: dtype {dataset.index.dtype}, expected {dtype}"
        if list(dataset.document_indices) != list(range(len(expected) + 1)):
            return f"{name}: document_indices {list(dataset.document_indices[:8])}..., expected 0, 1, 2, ..."
        problem = first_difference(name, expected, lambda k: dataset[k], len(dataset), dataset.sequence_lengths)
        if problem:
            return problem
    return None


def check_megatron_legacy(prefix, expected, dtype):
    for cached in (False, True):
        name = "megatron-legacy " + ("IndexedCachedDataset" if cached else "IndexedDataset")
        dataset = MegatronLegacyIndexedDataset(prefix, cached)
        if dtype and numpy.dtype(dataset.dtype) != numpy.dtype(dtype):
            return f"{name}: dtype {numpy.dtype(dataset.dtype)}, expected {dtype}"
        if list(dataset.doc_idx) != list(range(len(expected) + 1)):
            return f"{name}: doc_idx {list(dataset.doc_idx[:8])}..., expected 0, 1, 2, ..."
        problem = first_difference(name, expected, lambda k: dataset[k], len(dataset), dataset.sizes)
        if problem:
            return problem
    return None


def check_fairseq(prefix, expected, dtype, impls):
    data_utils, indexed_dataset = load_fairseq(FAIRSEQ_SOURCE)
    for impl in impls:
        name = f"fairseq load_indexed_dataset(dataset_impl={impl})"
        if impl is None:
            name += f" (inferred: {indexed_dataset.infer_dataset_impl(prefix)})"
        dataset = data_utils.load_indexed_dataset(prefix, None, dataset_impl=impl)
        if dataset is None:
            return f"{name}: returned None"
        if getattr(dataset, "supports_prefetch", False):
            dataset.prefetch(range(len(dataset)))  # what fairseq's iterators do for "cached"
        stored = getattr(dataset, "dtype", None) or dataset._index.dtype
        if dtype and numpy.dtype(stored) != numpy.dtype(dtype):
            return f"{name}: dtype {numpy.dtype(stored)}, expected {dtype}"
        problem = first_difference(name, expected, lambda k: dataset[k].tolist(), len(dataset), dataset.sizes)
        if problem:
            return problem
    return None


CHECKS = {
    "megatron-core": lambda prefix, expected, dtype: check_megatron_core(prefix, expected, dtype),
    "megatron-legacy": lambda prefix, expected, dtype: check_megatron_legacy(prefix, expected, dtype),
    "fairseq-mmap": lambda prefix, expected, dtype: check_fairseq(prefix, expected, dtype, ["mmap", None]),
    "fairseq-tntidx": lambda prefix, expected, dtype: check_fairseq(prefix, expected, dtype, ["lazy", "cached", None]),
}


def check(reader, dtype, prefix, expected):
    """None when `reader` serves exactly `expected` from `prefix`, else what differs."""
    try:
        return CHECKS[reader](prefix, expected, dtype)
    except Exception as error:  # a reader that fails on the file is a mismatch too
        return f"{reader} raised {type(error).__name__}: {error}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("input")
    parser.add_argument("--append-eod", action="store_true")
    parser.add_argument("--key", default="text")
    parser.add_argument("--shard", nargs=3, action="append", default=[], metavar=("READER", "DTYPE", "PREFIX"))
    parser.add_argument("--mismatch", nargs=3, action="append", default=[], metavar=("READER", "DTYPE", "PREFIX"))
    args = parser.parse_args()
    for reader, _, _ in args.shard + args.mismatch:
        if reader not in CHECKS:
            parser.error(f"unknown reader {reader!r} (expected one of {', '.join(CHECKS)})")

    expected = expected_documents(args.model, args.input, args.key, args.append_eod)
    tokens = sum(len(ids) for ids in expected)
    failed = False
    for reader, dtype, prefix in args.shard:
        problem = check(reader, dtype, prefix, expected)
        if problem:
            print(f"MISMATCH {prefix}: {problem}")
            failed = True
        else:
            print(f"ok: {reader} read {prefix}: {len(expected)} documents ({tokens} tokens) equal to sentencepiece")
    for reader, dtype, prefix in args.mismatch:
        problem = check(reader, dtype, prefix, expected)
        if problem:
            print(f"ok: {reader} does not read {prefix}: {problem}")
        else:
            print(f"UNEXPECTED {reader} read {prefix} right, but it was written for another reader")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
