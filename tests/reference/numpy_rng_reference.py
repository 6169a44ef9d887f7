#!/usr/bin/env python3
"""numpy's legacy RandomState outputs that dufu's NumpyRandomState must reproduce.

Megatron-LM shuffles its dataset indices with numpy.random.RandomState(seed), so
dufu's indices equal Megatron's only if every draw equals numpy's. For each seed
one RandomState is used in this order, and its results are printed one per line:

  seed <seed>
  shuffle <n> <values...>       RandomState.shuffle(np.arange(n))
  u32 <values...>               raw MT19937 outputs (next_u32)
  interval <max> <values...>    random_interval(max)

Read by tests/common/numpy_random_test.cc, which replays the same calls in C++.
"""
import sys

import numpy as np

SEEDS = [0, 1, 1234, 2**32 - 1]
SIZES = [1, 2, 17, 1000, 100003]
MAXIMA = [0, 1, 2, 5, 1000, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1,
          3 * 2**40 + 7, 2**63, 2**64 - 1]
DRAWS = 5


def raw_u32(rs, count):
    # For the full 32-bit range legacy randint skips the rejection loop and returns
    # next_uint32 unmasked: the generator's raw output.
    return rs.randint(0, 2**32, size=count, dtype=np.uint32)


def intervals(rs, max_value, count):
    # Legacy randint is masked rejection sampling; over [0, max] it is exactly
    # random_interval(max): 32-bit draws up to 0xffffffff, 64-bit draws above.
    return rs.randint(0, max_value + 1, size=count, dtype=np.uint64)


def random_interval_from_raw(raw, max_value):
    """random_interval written out over a stream of raw 32-bit draws."""
    if max_value == 0:
        return 0
    mask = max_value
    for shift in (1, 2, 4, 8, 16, 32):
        mask |= mask >> shift
    while True:
        if max_value <= 0xFFFFFFFF:
            value = next(raw) & mask
        else:
            value = ((next(raw) << 32) | next(raw)) & mask
        if value <= max_value:
            return value


def self_check():
    """Fails loudly if this numpy's helpers are not the raw draws assumed above."""
    # The C++ standard fixes these outputs of mt19937 seeded with 5489.
    raw = raw_u32(np.random.RandomState(5489), 10000)
    assert int(raw[0]) == 3499211612 and int(raw[-1]) == 4123659995, "randint is not raw MT19937"
    for max_value in MAXIMA:
        raw = iter(int(v) for v in raw_u32(np.random.RandomState(42), 4 * DRAWS + 8))
        expected = [random_interval_from_raw(raw, max_value) for _ in range(DRAWS)]
        got = [int(v) for v in intervals(np.random.RandomState(42), max_value, DRAWS)]
        assert got == expected, f"randint is not random_interval for max={max_value}"
    # The worked example of docs/index-algorithms.md, section 1.
    rs = np.random.RandomState(1234)
    first, second = np.arange(20), np.arange(10)
    rs.shuffle(first)
    rs.shuffle(second)
    assert first.tolist() == [3, 13, 2, 16, 14, 5, 4, 0, 8, 18, 17, 11, 10, 9, 7, 1, 19, 12, 6, 15]
    assert second.tolist() == [8, 1, 7, 6, 9, 5, 4, 3, 0, 2]


def main():
    self_check()
    out = []
    for seed in SEEDS:
        rs = np.random.RandomState(seed)
        out.append(f"seed {seed}")
        for n in SIZES:
            values = np.arange(n, dtype=np.int64)
            rs.shuffle(values)
            out.append(f"shuffle {n} " + " ".join(map(str, values.tolist())))
        out.append("u32 " + " ".join(map(str, raw_u32(rs, DRAWS).tolist())))
        for max_value in MAXIMA:
            draws = intervals(rs, max_value, DRAWS).tolist()
            out.append(f"interval {max_value} " + " ".join(map(str, draws)))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
