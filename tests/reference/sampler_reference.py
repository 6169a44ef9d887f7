#!/usr/bin/env python3
"""Reference orders for dufu's samplers (tests/dataprep/sampler_test.cc compares).

Written independently of the C++ code from numpy and from torch's DistributedSampler:

  shuffle N SEED EPOCH: numpy.random.RandomState((SEED + EPOCH) % 2**32).shuffle(arange(N))
  distributed N R RANK SHUFFLE DROP_LAST SEED EPOCH INNER INNER_SEED: the indices that
      torch.utils.data.DistributedSampler semantics give rank RANK over the positions of
      an inner sampler (INNER = sequential, or random with INNER_SEED), the permutation
      being numpy's RandomState(SEED + EPOCH) instead of torch.randperm.

Each line is "<case>: v0 v1 v2 ...". With torch importable, the plain-Python padding
and striding is first checked against torch's own DistributedSampler (shuffle=False).
"""
import math
import sys

import numpy as np


def numpy_shuffle(n, seed, epoch):
    values = np.arange(n, dtype=np.int64)
    np.random.RandomState((seed + epoch) % 2**32).shuffle(values)
    return values.tolist()


def distributed_positions(length, num_replicas, rank, shuffle, drop_last, seed, epoch):
    """torch DistributedSampler.__iter__, over positions 0..length-1."""
    if drop_last and length % num_replicas != 0:
        num_samples = math.ceil((length - num_replicas) / num_replicas)
    else:
        num_samples = math.ceil(length / num_replicas)
    total_size = num_samples * num_replicas
    if shuffle:
        indices = numpy_shuffle(length, seed, epoch)
    else:
        indices = list(range(length))
    if not drop_last:
        padding_size = total_size - len(indices)
        if padding_size <= len(indices):
            indices += indices[:padding_size]
        else:
            indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
    else:
        indices = indices[:total_size]
    assert len(indices) == total_size
    indices = indices[rank:total_size:num_replicas]
    assert len(indices) == num_samples
    return indices


def check_against_torch():
    try:
        from torch.utils.data import DistributedSampler
    except ImportError:
        return
    for length in (1, 2, 3, 5, 7, 10, 16):
        for replicas in (1, 2, 3, 4, 8, 11):
            for rank in range(replicas):
                for drop_last in (False, True):
                    if drop_last and length < replicas:
                        continue
                    torch_order = list(DistributedSampler(range(length), num_replicas=replicas, rank=rank,
                                                          shuffle=False, drop_last=drop_last))
                    ours = distributed_positions(length, replicas, rank, False, drop_last, 0, 0)
                    assert torch_order == ours, (length, replicas, rank, drop_last, torch_order, ours)


SHUFFLES = [
    (1, 0, 0), (2, 0, 0), (10, 0, 0), (10, 0, 1), (10, 1, 0), (37, 1234, 0), (37, 1234, 1),
    (37, 1234, 7), (100, 42, 0), (100, 42, 1), (1000, 5, 3), (1000, 2**32 - 1, 0),
    (1000, 2**32 - 1, 1), (1000, 2**32 - 2, 5), (12345, 2024, 2),
]

# (n, R, rank, shuffle, drop_last, seed, epoch, inner, inner_seed)
DISTRIBUTED = []
for n, replicas in ((10, 3), (11, 4), (7, 8), (3, 5), (16, 4), (1, 2), (100, 7)):
    for rank in sorted({0, replicas // 2, replicas - 1}):
        for shuffle in (False, True):
            for drop_last in (False, True):
                if drop_last and n < replicas:
                    continue
                for epoch in (0, 1):
                    DISTRIBUTED.append((n, replicas, rank, shuffle, drop_last, 17, epoch, "sequential", 0))
DISTRIBUTED += [
    (50, 4, 1, True, False, 3, 0, "random", 99),
    (50, 4, 3, True, True, 3, 2, "random", 99),
    (50, 3, 2, False, False, 3, 1, "random", 7),
    (23, 6, 5, True, False, 2**32 - 1, 1, "random", 2**32 - 1),
]


def main():
    check_against_torch()
    out = sys.stdout
    for n, seed, epoch in SHUFFLES:
        out.write(f"shuffle {n} {seed} {epoch}: " + " ".join(map(str, numpy_shuffle(n, seed, epoch))) + "\n")
    for n, replicas, rank, shuffle, drop_last, seed, epoch, inner, inner_seed in DISTRIBUTED:
        positions = distributed_positions(n, replicas, rank, shuffle, drop_last, seed, epoch)
        if inner == "random":
            inner_order = numpy_shuffle(n, inner_seed, epoch)  # the proxy sets the inner epoch too
            values = [inner_order[p] for p in positions]
        else:
            values = positions
        out.write(f"distributed {n} {replicas} {rank} {int(shuffle)} {int(drop_last)} {seed} {epoch} "
                  f"{inner} {inner_seed}: " + " ".join(map(str, values)) + "\n")


if __name__ == "__main__":
    main()
