"""Samplers against plain numpy/torch semantics (tests/reference/sampler_reference.py),
and the loader: batches in sampler order equal to the dataset's samples, epochs
rolling over, exact restore from state_dict(), torch tensors without a copy or a
warning, and dufu's errors."""

import os
import sys
import warnings

import numpy as np
import pytest
import torch

import dufu
from conftest import write_mmidx_shard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
import sampler_reference  # noqa: E402


@pytest.fixture
def dataset(shard):
    prefix, _, _ = shard
    return dufu.CausalLMDataset(dufu.IndexedDataset(prefix), 16, use_cache=False)


def test_random_sampler_is_numpys_shuffle():
    sampler = dufu.RandomSampler(23, seed=9)
    for epoch in (0, 1, 5):
        sampler.set_epoch(epoch)
        assert sampler.epoch == epoch and len(sampler) == 23
        assert list(sampler) == sampler_reference.numpy_shuffle(23, 9, epoch)
    assert list(dufu.SequentialSampler(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_proxy_sampler(shuffle, drop_last):
    for rank in range(3):
        sampler = dufu.DistributedProxySampler(dufu.SequentialSampler(10), 3, rank, shuffle=shuffle, seed=4,
                                               drop_last=drop_last)
        for epoch in (0, 2):
            sampler.set_epoch(epoch)
            expected = sampler_reference.distributed_positions(10, 3, rank, shuffle, drop_last, 4, epoch)
            assert list(sampler) == expected


def test_megatron_sampler_is_the_rank_slice_of_each_global_batch():
    n, micro, ranks = 50, 3, 2
    for rank in range(ranks):
        sampler = dufu.MegatronPretrainingSampler(n, micro, rank, ranks)
        expected = [
            start + rank * micro + j for start in range(0, n - micro * ranks + 1, micro * ranks) for j in range(micro)
        ]
        assert list(sampler) == expected


def test_loader_batches_follow_the_sampler_across_epochs(dataset):
    sampler = dufu.RandomSampler(len(dataset), seed=3)
    loader = dufu.DataLoader(dataset, sampler, 4, workers=3, prefetch_batches=2, with_indices=True)
    order = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order += list(sampler)
    served = []
    for _ in range(len(order) // 4):
        tokens, indices = next(loader)
        assert tokens.shape == (4, 17) and tokens.dtype == np.int32 and indices.dtype == np.int64
        assert tokens.flags.writeable and tokens.flags.c_contiguous
        np.testing.assert_array_equal(tokens, dataset.get_batch(indices))
        served += indices.tolist()
    assert served == order
    assert loader.state_dict()["batches_served"] == len(order) // 4


def test_loader_restores_to_the_exact_next_batch(dataset):
    sampler = dufu.MegatronPretrainingSampler(len(dataset), 2, 1, 2)
    straight = dufu.DataLoader(dataset, sampler, 2, with_indices=True)
    reference = [next(straight)[1].tolist() for _ in range(40)]
    first = dufu.DataLoader(dataset, sampler, 2, with_indices=True)
    for _ in range(13):
        next(first)
    state = first.state_dict()
    assert state["batches_served"] == 13
    del first
    resumed = dufu.DataLoader(dataset, sampler, 2, with_indices=True, state=state)
    assert [next(resumed)[1].tolist() for _ in range(27)] == reference[13:]
    resumed.load_state_dict(state)
    assert next(resumed)[1].tolist() == reference[13]


def test_torch_output_is_the_loaders_buffer_without_warnings(dataset):
    loader = dufu.DataLoader(dataset, dufu.SequentialSampler(len(dataset)), 3, output="torch", with_indices=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokens, indices = next(loader)
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int32 and tuple(tokens.shape) == (3, 17)
    np.testing.assert_array_equal(tokens.numpy(), dataset.get_batch(indices.numpy()))
    tokens += 1  # a buffer Python owns: writable, and the next batch is another one
    assert not np.shares_memory(tokens.numpy(), next(loader)[0].numpy())


def test_loader_errors(dataset, tmp_path):
    with pytest.raises(dufu.DufuError, match="micro_batch"):
        dufu.DataLoader(dataset, dufu.SequentialSampler(len(dataset)), 0)
    with pytest.raises(ValueError, match="output"):
        dufu.DataLoader(dataset, dufu.SequentialSampler(len(dataset)), 1, output="jax")
    loader = dufu.DataLoader(dataset, dufu.SequentialSampler(len(dataset)), 1)
    with pytest.raises(dufu.DufuError, match="batches_served"):
        loader.load_state_dict({"epoch": 0, "position": 0})
    # A shard that shrinks under the loader: the worker's IO error surfaces in next().
    prefix = str(tmp_path / "small")
    write_mmidx_shard(prefix, [[40], [40]])
    small = dufu.CausalLMDataset(dufu.IndexedDataset(prefix, "lazy"), 8, use_cache=False)
    os.truncate(prefix + ".bin", 10)
    broken = dufu.DataLoader(small, dufu.SequentialSampler(len(small)), 2, workers=1)
    with pytest.raises(dufu.DufuError, match="small.bin"):
        for _ in range(len(small)):
            next(broken)
