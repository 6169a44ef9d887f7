"""The package's own errors for values of the wrong kind or range, where pybind11's
argument conversion used to answer with a raw TypeError ("incompatible function
arguments") or cast error: an index too large for int64 is out of range like any
other (IndexError), a non-integer index is a TypeError naming its type, and a loader
state_dict or an epoch with a bad value is a DufuError naming the entry."""

import numpy as np
import pytest

import dufu


@pytest.fixture
def datasets(shard):
    prefix, _, _ = shard
    items = dufu.IndexedDataset(prefix)
    samples = dufu.CausalLMDataset(items, seq_length=16, use_cache=False)
    blend = dufu.BlendedDataset([samples, samples], [0.5, 0.5], size=10, use_cache=False)
    return items, samples, blend


def test_indices_too_large_for_int64_are_out_of_range(datasets):
    items, samples, blend = datasets
    sampler = dufu.SequentialSampler(len(samples))
    for huge in (2**63, -(2**63) - 1, 2**200):
        with pytest.raises(IndexError, match=f"sequence index {huge} is out of range"):
            items[huge]
        with pytest.raises(IndexError, match=f"sequence index {huge} is out of range"):
            items.get(huge)
        with pytest.raises(IndexError, match=f"sample index {huge} is out of range"):
            samples[huge]
        with pytest.raises(IndexError, match=f"sample index {huge} is out of range"):
            samples.get_batch([0, huge])
        with pytest.raises(IndexError, match=f"blend sample index {huge} is out of range"):
            blend.source_of(huge)
        with pytest.raises(IndexError, match=f"sampler position index {huge} is out of range"):
            sampler.at(huge)


def test_indices_of_another_type_name_it(datasets):
    items, samples, _ = datasets
    with pytest.raises(TypeError, match="sequence indices must be integers, not str"):
        items["0"]
    with pytest.raises(TypeError, match="sample indices must be integers, not float"):
        samples[1.0]
    # numpy's integers are integers; negative ones count from the end.
    assert samples[np.int64(-1)].tolist() == samples[len(samples) - 1].tolist()
    assert samples.get_batch(np.array([0, 1])).shape == (2, 17)


def test_bad_loader_states_and_epochs_are_named(datasets):
    _, samples, _ = datasets
    loader = dufu.DataLoader(samples, dufu.SequentialSampler(len(samples)), 2)
    good = loader.state_dict()
    for key, value, expected in [("epoch", "1", "must be a non-negative integer, not str"),
                                 ("position", 1.5, "must be a non-negative integer, not float"),
                                 ("batches_served", True, "must be a non-negative integer, not bool"),
                                 ("epoch", -1, "must be an integer from 0 to 2\\*\\*64 - 1, got -1"),
                                 ("position", 2**64, f"must be an integer from 0 to 2\\*\\*64 - 1, got {2**64}")]:
        with pytest.raises(dufu.DufuError, match=f"loader state_dict\\['{key}'\\] {expected}"):
            loader.load_state_dict(dict(good, **{key: value}))
        with pytest.raises(dufu.DufuError, match=f"loader state_dict\\['{key}'\\] {expected}"):
            dufu.DataLoader(samples, dufu.SequentialSampler(len(samples)), 2, state=dict(good, **{key: value}))
    with pytest.raises(dufu.DufuError, match="epoch must be a non-negative integer, not NoneType"):
        dufu.SequentialSampler(4).set_epoch(None)
    # The loader is untouched by the refusals.
    assert loader.state_dict() == good
