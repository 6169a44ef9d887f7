"""dufu.IndexedDataset: items match the bytes written by hand, mmap items are
read-only views of the mapped .bin that keep the mapping alive, and dufu's errors
arrive as DufuError with the tool's message."""

import gc

import numpy as np
import pytest

import dufu
from conftest import run_dataprep, write_mmidx_shard


def expected_sequences(documents, tokens):
    lengths = [length for document in documents for length in document]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [tokens[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]


@pytest.mark.parametrize("impl", ["mmap", "lazy", "cached"])
def test_items_are_the_sequences_written(shard, impl):
    prefix, documents, tokens = shard
    dataset = dufu.IndexedDataset(prefix, impl)
    expected = expected_sequences(documents, tokens)
    assert len(dataset) == len(expected)
    assert dataset.num_documents == len(documents)
    assert dataset.dtype == np.dtype("<u2")
    assert dataset.layout == "MMIDIDX"
    assert dataset.total_tokens == len(tokens)
    assert list(dataset.sequence_lengths) == [len(sequence) for sequence in expected]
    assert list(dataset.document_indices) == list(np.cumsum([0] + [len(d) for d in documents]))
    for i, sequence in enumerate(expected):
        item = dataset[i]
        assert item.dtype == np.dtype("<u2")
        np.testing.assert_array_equal(item, sequence)
    np.testing.assert_array_equal(dataset[-1], expected[-1])
    np.testing.assert_array_equal(dataset.get(3, offset=1), expected[3][1:])
    np.testing.assert_array_equal(dataset.get(5, offset=0, length=1), expected[5][:1])


def test_mmap_items_share_memory_with_the_mapping(shard):
    prefix, documents, tokens = shard
    dataset = dufu.IndexedDataset(prefix, "mmap")
    mapping = dataset.bin_buffer
    assert mapping.nbytes == tokens.nbytes and not mapping.flags.writeable
    item = dataset[7]
    assert not item.flags.owndata and not item.flags.writeable
    assert np.shares_memory(item, mapping)
    # The view starts exactly at the sequence's byte offset in the mapping.
    offset = sum(dataset.sequence_lengths[:7]) * 2
    address = item.__array_interface__["data"][0]
    assert address == mapping.__array_interface__["data"][0] + offset
    with pytest.raises(ValueError):
        item[0] = 1
    # The view keeps the mapping alive after the dataset and its buffer are gone.
    expected = expected_sequences(documents, tokens)[7].copy()
    del dataset, mapping
    gc.collect()
    np.testing.assert_array_equal(item, expected)


def test_lazy_and_cached_items_are_copies(shard):
    prefix, _, _ = shard
    for impl in ("lazy", "cached"):
        dataset = dufu.IndexedDataset(prefix, impl)
        assert dataset.bin_buffer is None
        assert dataset[0].flags.owndata or dataset[0].base is not None
        assert dataset[0].flags.writeable


def test_out_of_range_is_index_error(shard):
    prefix, _, _ = shard
    dataset = dufu.IndexedDataset(prefix)
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    with pytest.raises(IndexError):
        dataset[-len(dataset) - 1]
    assert sum(1 for _ in dataset) == len(dataset)  # iteration stops at IndexError
    with pytest.raises(dufu.DufuError, match="out of range"):
        dataset.get(0, offset=0, length=int(dataset.sequence_lengths[0]) + 1)


def test_errors_carry_dufus_message(tmp_path, shard):
    prefix, _, _ = shard
    missing = str(tmp_path / "missing")
    with pytest.raises(dufu.DufuError) as caught:
        dufu.IndexedDataset(missing)
    assert isinstance(caught.value, RuntimeError)
    message = str(caught.value)
    assert "missing.idx" in message
    status, _, stderr = run_dataprep("inspect", missing)
    assert status == 1 and message in stderr
    # A truncated .idx: dufu's own message names the file and what is wrong.
    with open(prefix + ".idx", "r+b") as idx:
        idx.truncate(40)
    with pytest.raises(dufu.DufuError) as caught:
        dufu.IndexedDataset(prefix, "lazy")
    status, _, stderr = run_dataprep("inspect", prefix)
    assert status == 1 and str(caught.value) in stderr and "shard.idx" in str(caught.value)
    with pytest.raises(dufu.DufuError, match="mmap"):
        dufu.IndexedDataset(prefix, "mmapp")


def test_int32_shard(tmp_path):
    prefix = str(tmp_path / "wide")
    tokens = write_mmidx_shard(prefix, [[3, 4], [5]], dtype=np.int32, start=70000)
    dataset = dufu.IndexedDataset(prefix)
    assert dataset.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(np.concatenate([dataset[i] for i in range(3)]), tokens)
