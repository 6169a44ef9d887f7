"""Document masking in the loader (DataLoader(eod_id=...)): the position ids and the
document boundaries (cu_seqlens) of every batch equal those of Megatron's
_get_ltor_masks_and_position_ids on the same samples (tests/reference/
megatron_masks_reference.py), for any number of workers and in torch output."""

import os
import sys

import numpy as np
import pytest
import torch

import dufu
from conftest import write_mmidx_shard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
import megatron_masks_reference as megatron  # noqa: E402

EOD = 0


@pytest.fixture
def packed_shard(tmp_path):
    """A shard of 60 documents of 1-40 tokens in [1, 50), each ended by EOD (a document of
    length 1 is the EOD alone), so samples of 24 tokens hold several documents, some
    starting or ending on a sample's edge."""
    rng = np.random.RandomState(11)
    lengths = [int(rng.randint(1, 41)) for _ in range(60)]
    prefix = str(tmp_path / "packed")
    write_mmidx_shard(prefix, [[length] for length in lengths])
    tokens = np.concatenate([np.append(rng.randint(1, 50, size=length - 1), EOD) for length in lengths])
    with open(prefix + ".bin", "wb") as out:
        out.write(tokens.astype(np.uint16).tobytes())
    return prefix


def expected_documents(tokens):
    """Megatron's position ids [B, T] and the cu_seqlens its masks imply, from tokens [B, T + 1]."""
    rows, columns = tokens.shape
    T = columns - 1
    positions, cu_seqlens = [], []
    for row in range(rows):
        data = torch.from_numpy(np.asarray(tokens[row, :T], dtype=np.int64))
        mask, _, position_ids = megatron.ltor_masks_and_position_ids(data, EOD, True, True, True)
        positions.append(position_ids.numpy())
        cu_seqlens += [row * T + start for start in megatron.document_starts_of_mask(mask)]
    return np.stack(positions), np.asarray(cu_seqlens + [rows * T])


@pytest.mark.parametrize("workers", [1, 3])
def test_documents_are_megatrons(packed_shard, workers):
    dataset = dufu.CausalLMDataset(dufu.IndexedDataset(packed_shard), 24, use_cache=False)
    loader = dufu.DataLoader(dataset, dufu.RandomSampler(len(dataset), seed=2), 3, workers=workers,
                             eod_id=EOD, with_indices=True)
    starts_seen = 0
    for _ in range(2 * len(dataset) // 3):
        batch = next(loader)
        tokens = batch["tokens"]
        want_positions, want_cu_seqlens = expected_documents(tokens)
        assert batch["position_ids"].dtype == np.int32 and batch["cu_seqlens"].dtype == np.int32
        np.testing.assert_array_equal(batch["position_ids"], want_positions)
        np.testing.assert_array_equal(batch["cu_seqlens"], want_cu_seqlens)
        assert batch["indices"].shape == (3,)
        starts_seen += len(want_cu_seqlens) - 4
    assert starts_seen > 20, "the samples should hold many document starts inside rows"


def test_documents_in_torch_and_plain_batches_unchanged(packed_shard):
    dataset = dufu.CausalLMDataset(dufu.IndexedDataset(packed_shard), 24, use_cache=False)
    plain = dufu.DataLoader(dataset, dufu.SequentialSampler(len(dataset)), 2)
    packed = dufu.DataLoader(dataset, dufu.SequentialSampler(len(dataset)), 2, output="torch", eod_id=EOD)
    for _ in range(4):
        tokens = next(plain)
        batch = next(packed)
        assert isinstance(tokens, np.ndarray) and tokens.shape == (2, 25)
        assert torch.equal(batch["tokens"], torch.from_numpy(tokens))
        want_positions, want_cu_seqlens = expected_documents(tokens)
        assert torch.equal(batch["position_ids"], torch.from_numpy(want_positions.astype(np.int32)))
        assert torch.equal(batch["cu_seqlens"], torch.from_numpy(want_cu_seqlens.astype(np.int32)))


def test_distributed_iterable_dataset_hands_out_documents(packed_shard):
    import dufu.torch

    dataset = dufu.CausalLMDataset(dufu.IndexedDataset(packed_shard), 24, use_cache=False)
    ranks = dufu.torch.DistributedIterableDataset(dataset, 2, 1, 2, eod_id=EOD)
    batch = next(iter(ranks))
    want_positions, want_cu_seqlens = expected_documents(batch["tokens"].numpy())
    np.testing.assert_array_equal(batch["position_ids"].numpy(), want_positions)
    np.testing.assert_array_equal(batch["cu_seqlens"].numpy(), want_cu_seqlens)
