"""Shared pieces of the Python package's tests: synthetic shards written here byte by
byte from docs/formats.md (independent of dufu's writer), whose token values encode
their position in the shard, so every read can be checked exactly; and the paths the
ctest registration passes in (tests/python/CMakeLists.txt)."""

import os
import struct
import subprocess

import numpy as np
import pytest

DATAPREP = os.environ.get("DUFU_DATAPREP_TOOL", "")
FIXTURE_DIR = os.environ.get("DUFU_FIXTURE_DIR", "")


def write_mmidx_shard(prefix, documents, dtype=np.uint16, start=0):
    """Writes PREFIX.bin/.idx in Megatron's MMIDIDX layout. `documents` is a list of
    documents, each a list of sequence lengths; token k of the shard is (start + k)
    mod 2^16 (or mod 2^31 for int32). Returns the shard's tokens as one array."""
    codes = {np.uint8: 1, np.int32: 4, np.uint16: 8}
    lengths = [length for document in documents for length in document]
    total = sum(lengths)
    modulus = 1 << 16 if dtype == np.uint16 else (1 << 8 if dtype == np.uint8 else 1 << 31)
    tokens = ((np.arange(total, dtype=np.int64) + start) % modulus).astype(dtype)
    with open(prefix + ".bin", "wb") as out:
        out.write(tokens.tobytes())
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * itemsize
    document_indices = np.concatenate([[0], np.cumsum([len(document) for document in documents])]).astype(np.int64)
    with open(prefix + ".idx", "wb") as out:
        out.write(b"MMIDIDX\x00\x00")
        out.write(struct.pack("<QBQQ", 1, codes[dtype], len(lengths), len(document_indices)))
        out.write(np.asarray(lengths, dtype="<i4").tobytes())
        out.write(pointers.astype("<i8").tobytes())
        out.write(document_indices.astype("<i8").tobytes())
    return tokens


def run_dataprep(*args):
    """Runs the dataprep tool; returns (exit status, stdout, stderr)."""
    if not DATAPREP:
        pytest.skip("DUFU_DATAPREP_TOOL is not set (run through ctest)")
    done = subprocess.run([DATAPREP, *args], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def shard(tmp_path):
    """A uint16 shard of 40 documents of 1-3 sequences of 1-90 tokens."""
    rng = np.random.RandomState(5)
    documents = [list(rng.randint(1, 91, size=rng.randint(1, 4))) for _ in range(40)]
    prefix = str(tmp_path / "shard")
    tokens = write_mmidx_shard(prefix, documents)
    return prefix, documents, tokens
