#!/usr/bin/env python3
"""torch's own float32 -> bfloat16 conversion, the oracle of dufu's bf16 rounding.

Prints one line per value, "FLOAT_BITS BF16_BITS" in hex: the float's bits, then the
bits of torch.tensor(x, dtype=torch.float32).to(torch.bfloat16). First the edge
cases of round-to-nearest-even (ties going to the even neighbour either way, values
just off a tie, subnormals, carries that round up into the next exponent, the
largest finite values rounding up to infinity, infinities, NaNs), then random floats
drawn as random bit patterns (every exponent, both signs), then random floats near 1
where the low 16 bits take every kind of value.

Read by tests/trainer/bf16_test.cc, which converts the same floats and compares bit
for bit (for NaN only that the result is a quiet NaN: torch's vectorized conversion
writes 0xffff for every NaN, its scalar one 0x7fc0).
"""
import sys

import numpy as np
import torch

EDGE_BITS = [
    0x00000000, 0x80000000,              # signed zeros
    0x3F800000, 0xBF800000,              # +-1
    0x3F808000,                          # 1 + 2^-8: a tie, even neighbour below (down)
    0x3F818000,                          # a tie whose lower neighbour is odd (up)
    0x3F807FFF, 0x3F808001,              # just below and above a tie
    0xBF818000,                          # a negative tie (away from zero, to even)
    0x3F7FFFFF,                          # rounds up into the next exponent (1.0)
    0x3FFFFFFF, 0x407FFFFF,              # likewise, 2.0 and 4.0
    0x00000001, 0x80000001,              # smallest subnormals (round to zero)
    0x00008000, 0x00018000,              # subnormal ties: down to 0, up to 2
    0x00010000, 0x007F0000,              # subnormals exact in bf16
    0x007FFFFF,                          # largest subnormal rounds up to the smallest normal
    0x00800000, 0x00807FFF, 0x00808000,  # smallest normal and its neighbours
    0x7F7F0000, 0xFF7F0000,              # bf16's largest finite
    0x7F7F7FFF,                          # below the midpoint to 2^128: stays finite
    0x7F7F8000,                          # the midpoint (odd below): rounds to infinity
    0x7F7FFFFF, 0xFF7FFFFF,              # float's largest finite: rounds to +-infinity
    0x7F800000, 0xFF800000,              # infinities
    0x7FC00000, 0xFFC00000,              # quiet NaNs
    0x7F800001, 0x7FA00000, 0xFF800001,  # signalling NaNs (payload low or high)
    0x7FFFFFFF,
]
RANDOM_BITS = 20000
NEAR_ONE = 5000
SEED = 20261124


def main():
    rng = np.random.default_rng(SEED)
    bits = np.array(EDGE_BITS, dtype=np.uint32)
    random_bits = rng.integers(0, 2**32, size=RANDOM_BITS, dtype=np.uint64).astype(np.uint32)
    near_one = (0x3F800000 + rng.integers(0, 2**23, size=NEAR_ONE, dtype=np.uint64)).astype(np.uint32)
    bits = np.concatenate([bits, random_bits, near_one])
    floats = torch.from_numpy(bits.view(np.float32).copy())
    assert floats.dtype == torch.float32
    converted = floats.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    out = sys.stdout
    for f, b in zip(bits.tolist(), converted.tolist()):
        out.write(f"{f:08x} {b:04x}\n")


if __name__ == "__main__":
    main()
