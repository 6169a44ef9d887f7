"""Causal-LM datasets and blends from Python: the same index caches, byte for byte,
as `dataprep build-index` writes (and each finds the other's), samples equal to a
plain numpy walk of Megatron's indices over the shard, and blends that follow their
dataset/sample index."""

import filecmp
import os

import numpy as np
import pytest

import dufu
from conftest import run_dataprep, write_mmidx_shard

SEQ = 16


def build_index_tool(data_path, cache_dir, *extra):
    status, stdout, stderr = run_dataprep(
        "build-index", "--data-path", data_path, "--seq-length", str(SEQ), "--cache-dir", str(cache_dir), *extra
    )
    assert status == 0, stderr
    return sorted(line.split()[1] for line in stdout.splitlines() if line.strip().startswith("cache "))


def cache_files_equal(left, right):
    names = sorted(os.listdir(left))
    assert names == sorted(os.listdir(right))
    assert any(name.endswith(".npy") for name in names)
    _, mismatch, errors = filecmp.cmpfiles(left, right, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)


def naive_sample(shard_tokens, shard, dataset, i):
    """Sample i from Megatron's three index arrays and the shard's tokens, in numpy."""
    document_index, sample_index, shuffle_index = dataset.document_index, dataset.sample_index, dataset.shuffle_index
    starts = np.concatenate([[0], np.cumsum(shard.sequence_lengths)])
    k = shuffle_index[i]
    (first, first_offset), (last, last_offset) = sample_index[k], sample_index[k + 1]
    pieces = []
    for position in range(first, last + 1):
        sequence = document_index[position]
        begin = starts[sequence] + (first_offset if position == first else 0)
        end = starts[sequence] + last_offset + 1 if position == last else starts[sequence + 1]
        pieces.append(shard_tokens[begin:end])
    return np.concatenate(pieces).astype(np.int32)


def test_causal_lm_indices_identical_to_build_index(shard, tmp_path):
    prefix, _, tokens = shard
    tool_cache, python_cache = tmp_path / "tool-cache", tmp_path / "python-cache"
    tool_paths = build_index_tool(prefix, tool_cache, "--num-samples", "300", "--seed", "7")
    assert len(tool_paths) == 1
    indexed = dufu.IndexedDataset(prefix)
    dataset = dufu.CausalLMDataset(
        indexed, SEQ, num_samples=300, seed=7, split="969,30,1", cache_dir=str(python_cache)
    )
    assert os.path.basename(dataset.cache_path) == os.path.basename(tool_paths[0])
    cache_files_equal(dataset.cache_path, tool_paths[0])
    # The arrays Python hands out are the files' arrays.
    np.testing.assert_array_equal(dataset.document_index, np.load(os.path.join(tool_paths[0], "document_index.npy")))
    np.testing.assert_array_equal(dataset.sample_index, np.load(os.path.join(tool_paths[0], "sample_index.npy")))
    np.testing.assert_array_equal(dataset.shuffle_index, np.load(os.path.join(tool_paths[0], "shuffle_index.npy")))
    assert len(dataset) >= 300 and dataset.num_epochs >= 2 and dataset.sample_length == SEQ + 1
    # Python finds the tool's cache instead of building its own.
    found = dufu.CausalLMDataset(indexed, SEQ, num_samples=300, seed=7, split="969,30,1", cache_dir=str(tool_cache))
    assert found.cache_path == tool_paths[0]
    for i in range(len(dataset)):
        np.testing.assert_array_equal(dataset[i], naive_sample(tokens, indexed, dataset, i))
    np.testing.assert_array_equal(dataset.get_batch([3, 1, -1]), np.stack([dataset[3], dataset[1], dataset[-1]]))


def test_uncached_dataset_equals_cached(shard, tmp_path):
    prefix, _, _ = shard
    indexed = dufu.IndexedDataset(prefix, "lazy")
    cached = dufu.CausalLMDataset(indexed, SEQ, split="8,1,1", split_part="valid", cache_dir=str(tmp_path))
    memory = dufu.CausalLMDataset(indexed, SEQ, split="8,1,1", split_part="valid", use_cache=False)
    assert memory.cache_path == "" and len(memory) == len(cached)
    np.testing.assert_array_equal(memory.shuffle_index, cached.shuffle_index)
    np.testing.assert_array_equal(memory.get_batch(range(len(memory))), cached.get_batch(range(len(cached))))


def test_blend_identical_to_build_index(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    tokens_a = write_mmidx_shard(a, [[50, 7], [33], [80], [12, 12, 12]] * 5)
    tokens_b = write_mmidx_shard(b, [[21], [64, 3]] * 9, start=30000)
    spec = f"0.7 {a} 0.3 {b}"
    tool_paths = build_index_tool(spec, tmp_path / "tool", "--num-samples", "120", "--split", "90,5,5")
    built = dufu.build_blend(spec, seq_length=SEQ, num_samples=120, split="90,5,5", cache_dir=str(tmp_path / "py"))
    assert len(built.cache_paths) == 3
    assert [os.path.basename(p) for p in sorted(built.cache_paths)] == [os.path.basename(p) for p in tool_paths]
    for path in built.cache_paths:
        cache_files_equal(path, str(tmp_path / "tool" / os.path.basename(path)))
    blend = built.dataset
    assert isinstance(blend, dufu.BlendedDataset) and len(blend) == 120
    assert built.weights == pytest.approx([0.7, 0.3])
    dataset_index, sample_index = blend.indices
    assert np.bincount(dataset_index).tolist() == [84, 36]
    for i in range(len(blend)):
        assert blend.source_of(i) == (dataset_index[i], sample_index[i])
        np.testing.assert_array_equal(blend[i], built.parts[dataset_index[i]][sample_index[i]])
    assert built.parts[0][0].max() < 30000 <= built.parts[1][0].min()
    # The same blend from its parts, and the list form of the spec.
    again = dufu.BlendedDataset(built.parts, [7, 3], size=120, cache_dir=str(tmp_path / "py"))
    assert again.cache_path == blend.cache_path
    listed = dufu.build_blend([(0.7, a), (0.3, b)], seq_length=SEQ, num_samples=120, split="90,5,5",
                              cache_dir=str(tmp_path / "py"))
    assert sorted(listed.cache_paths) == sorted(built.cache_paths)
    assert dufu.parse_blend_spec(spec) == [(0.7, a), (0.3, b)]


def test_dataset_errors_carry_dufus_message(shard, tmp_path):
    prefix, _, _ = shard
    indexed = dufu.IndexedDataset(prefix)
    with pytest.raises(dufu.DufuError) as caught:
        dufu.CausalLMDataset(indexed, 10**6, use_cache=False)
    assert "seq_length" in str(caught.value) or "tokens" in str(caught.value)
    status, _, stderr = run_dataprep("build-index", "--data-path", f"0.5 {prefix} -1 {prefix}", "--cache-dir",
                                     str(tmp_path))
    with pytest.raises(dufu.DufuError) as caught:
        dufu.build_blend(f"0.5 {prefix} -1 {prefix}", cache_dir=str(tmp_path))
    assert status == 1 and str(caught.value) in stderr
    with pytest.raises(dufu.DufuError, match="split part"):
        dufu.CausalLMDataset(indexed, SEQ, split="8,1,1", split_part="training", use_cache=False)
