"""A small PyTorch training loop on dufu's loader over two simulated data-parallel
ranks (gradients averaged as an all-reduce would): stopped after some steps, saved
with the loaders' state_dict() next to the model and optimizer, restored into fresh
objects and continued, it sees the same batches and computes the same losses, bit
for bit, as the uninterrupted run."""

import io

import numpy as np
import pytest
import torch

import dufu
import dufu.torch

RANKS, MICRO, SEQ, VOCAB = 2, 3, 16, 97
STEPS, STOP_AT = 14, 6


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def make_run(dataset, sampler):
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ranks = [
        dufu.torch.DistributedIterableDataset(dataset, MICRO, rank, RANKS, sampler=sampler, seed=11, workers=2)
        for rank in range(RANKS)
    ]
    return model, optimizer, ranks


def train(model, optimizer, ranks, streams, steps):
    """`steps` steps; returns each step's per-rank batches and mean loss."""
    history = []
    for _ in range(steps):
        optimizer.zero_grad()
        batches, losses = [], []
        for stream in streams:
            tokens = next(stream)
            batches.append(tokens.clone())
            ids = (tokens.long() % VOCAB)
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
            (loss / RANKS).backward()  # the mean over ranks, as an averaging all-reduce gives
            losses.append(loss.item())
        optimizer.step()
        history.append((batches, float(np.mean(losses))))
    return history


def streams_of(ranks):
    return [iter(torch.utils.data.DataLoader(rank, batch_size=None)) for rank in ranks]


@pytest.mark.parametrize("sampler", ["megatron", "distributed"])
def test_resumed_training_sees_the_same_batches(shard, tmp_path, sampler):
    torch.set_num_threads(1)
    prefix, _, _ = shard
    # The validation part of a 8,1,1 split: about 20 samples, so the 84 samples of the
    # run go through several epochs (and reshuffles, with the distributed sampler).
    dataset = dufu.build_blend(prefix, seq_length=SEQ, split="8,1,1", split_part="valid",
                               cache_dir=str(tmp_path)).dataset
    assert len(dataset) < STEPS * RANKS * MICRO // 2
    model, optimizer, ranks = make_run(dataset, sampler)
    straight = train(model, optimizer, ranks, streams_of(ranks), STEPS)
    assert ranks[0].state_dict()["epoch"] >= 2  # the run crosses epochs

    model, optimizer, ranks = make_run(dataset, sampler)
    first = train(model, optimizer, ranks, streams_of(ranks), STOP_AT)
    checkpoint = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "data": [rank.state_dict() for rank in ranks]}, checkpoint)
    assert [state["batches_served"] for state in torch.load(io.BytesIO(checkpoint.getvalue()))["data"]] == [STOP_AT] * 2
    del model, optimizer, ranks

    checkpoint.seek(0)
    saved = torch.load(checkpoint)
    model, optimizer, ranks = make_run(dataset, sampler)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    for rank, state in zip(ranks, saved["data"]):
        rank.load_state_dict(state)
    resumed = first + train(model, optimizer, ranks, streams_of(ranks), STEPS - STOP_AT)

    for (batches, loss), (resumed_batches, resumed_loss) in zip(straight, resumed):
        for batch, resumed_batch in zip(batches, resumed_batches):
            assert torch.equal(batch, resumed_batch)
        assert loss == resumed_loss
    # The two ranks read different samples at every step.
    assert all(not torch.equal(batches[0], batches[1]) for batches, _ in straight)
    assert straight[-1][1] < straight[0][1]  # and the model learns something


def test_adaptor_rejects_bad_ranks(shard):
    prefix, _, _ = shard
    dataset = dufu.CausalLMDataset(dufu.IndexedDataset(prefix), SEQ, use_cache=False)
    with pytest.raises(ValueError, match="rank"):
        dufu.torch.DistributedIterableDataset(dataset, 2, 2, 2)
    with pytest.raises(ValueError, match="sampler"):
        dufu.torch.DistributedIterableDataset(dataset, 2, 0, 2, sampler="random")
