#!/usr/bin/env python3
"""The loader from Python: tokens/s of `for batch in loader` (torch tensors, seq_length
2048, micro-batch 8, random sampler, mmap shard) as a ratio to the C++ loader
benchmark (loader_benchmark.cc) on the same shard with the same settings, measured in
the same run: --rounds rounds of C++ then Python, each one pass over the epoch. On a
shared machine single passes (about a second each) swing with other processes' load,
so the ratio is of the best pass of each; every pass and the load average are printed.

Before timing, a few Python batches are checked against the dataset's samples.

usage: /usr/bin/python3 benchmarks/python_loader_benchmark.py [--build DIR] [--work DIR]
           [--tokens N] [--micro-batch B] [--workers W] [--rounds R]
The build directory needs the targets _dufu and loader_benchmark, e.g.
    cmake --build build --target _dufu loader_benchmark
"""

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ_LENGTH = 2048


def fail(message):
    sys.exit(f"python_loader_benchmark: {message}")


def run_cpp(build, work, tokens, micro_batch, workers):
    program = os.path.join(build, "benchmarks", "loader_benchmark")
    if not os.access(program, os.X_OK):
        fail(f"{program} is missing: cmake --build {build} --target loader_benchmark")
    done = subprocess.run(
        [program, work, "--tokens", str(tokens), "--micro-batch", str(micro_batch), "--workers", str(workers)],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        fail(f"loader_benchmark failed: {done.stderr.strip()}")
    match = re.search(r"^\s*loader\s+([0-9.]+) M tokens/s", done.stdout, re.MULTILINE)
    if not match:
        fail(f"no loader rate in loader_benchmark's output:\n{done.stdout}")
    return float(match.group(1)) * 1e6


def run_python(dufu, work, micro_batch, workers):
    import numpy as np

    shard = dufu.IndexedDataset(os.path.join(work, "loader-shard"), "mmap")
    # As loader_benchmark.cc: the whole shard, one epoch, indices in memory, seed 1234.
    dataset = dufu.CausalLMDataset(shard, SEQ_LENGTH, use_cache=False)
    sampler = dufu.RandomSampler(len(dataset), seed=1234)

    check = dufu.DataLoader(dataset, sampler, micro_batch, workers=workers, prefetch_batches=8, output="torch",
                            with_indices=True)
    for _ in range(5):
        tokens, indices = next(check)
        if not np.array_equal(tokens.numpy(), dataset.get_batch(indices.numpy())):
            fail("a Python batch does not match the dataset's samples")
    del check

    # Warm the page cache as the C++ benchmark does.
    checksum = int(shard.bin_buffer[::4096].sum())
    batches = len(dataset) // micro_batch
    loader = dufu.DataLoader(dataset, sampler, micro_batch, workers=workers, prefetch_batches=8, output="torch")
    start = time.perf_counter()
    served = 0
    for batch in loader:
        served += 1
        if served == batches:
            break
    seconds = time.perf_counter() - start
    assert tuple(batch.shape) == (micro_batch, SEQ_LENGTH + 1) and checksum >= 0
    return batches * micro_batch * (SEQ_LENGTH + 1) / seconds, batches, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--work", default="/tmp/dufu-loader-bench")
    parser.add_argument("--tokens", type=int, default=256_000_000)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    try:
        import dufu
    except ImportError as error:
        fail(f"cannot import dufu from {args.build}/python ({error}): cmake --build {args.build} --target _dufu")

    print(f"loader from Python: seq_length {SEQ_LENGTH}, micro_batch {args.micro_batch}, {args.workers} workers, "
          f"random sampler, mmap shard of {args.tokens} tokens, torch tensors; load average {os.getloadavg()[0]:.2f}")
    cpp_rates, python_rates = [], []
    for _ in range(args.rounds):
        cpp_rates.append(run_cpp(args.build, args.work, args.tokens, args.micro_batch, args.workers))
        rate, batches, seconds = run_python(dufu, args.work, args.micro_batch, args.workers)
        python_rates.append(rate)
    print(f"  C++ loader     best {max(cpp_rates) / 1e6:8.2f} M tokens/s  (passes: "
          + ", ".join(f"{rate / 1e6:.1f}" for rate in cpp_rates) + ")")
    print(f"  Python loader  best {max(python_rates) / 1e6:8.2f} M tokens/s  (passes: "
          + ", ".join(f"{rate / 1e6:.1f}" for rate in python_rates) + f"; {batches} batches each)")
    print(f"  ratio Python/C++ (best passes): {max(python_rates) / max(cpp_rates):.3f}  (goal >= 0.9); "
          f"load average now {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
