#!/usr/bin/env python3
"""Summarizes Nsight Compute's raw CSV of a train_benchmark run (the GPU runner's step 8).

    ncu_summary.py LABEL=PROFILE.csv [LABEL=PROFILE.csv ...]

For each profile (`ncu --metrics gpu__time_duration.sum --csv --page raw`): the kernel
time of the whole run; the training step's kernels grouped by what they do (the step
runs from the first embedding launch up to the second: before it the benchmark
measures its GEMM rate, after it a forward gives the final loss); and the kernels by
name, largest first. Times are ncu's gpu__time_duration, summed.
"""
import collections
import csv
import sys

# (group, substrings of the kernel name), first match wins.
GROUPS = [
    ("attention forward", ("flash_forward", "bf16_forward_kernel")),
    ("attention backward", ("flash_backward", "bf16_backward_")),
    ("bf16 rounding and copies", ("store_bf16", "round_to_bf16", "to_bf16_bits", "load_bf16")),
    ("GEMMs (cuBLAS, cuBLASLt)", ("nvjet", "cublasLt", "xmma", "gemm", "Gemm")),
    ("LayerNorm forward", ("layernorm_kernel", "rmsnorm_kernel")),
    ("LayerNorm backward", ("layernorm_", "rmsnorm_")),
    ("classifier", ("classifier", "masked_mean")),
    ("bias-gradient column sums", ("column_",)),
    ("AdamW", ("adamw",)),
    ("gradient norm and clip", ("squares_", "ordered_sum", "scale_kernel")),
    ("embedding", ("embed_kernel", "dwte", "dwpe", "bucket_keys", "Radix")),
    ("fill (zero_grad)", ("fill_kernel",)),
]


def group_of(kernel):
    for group, needles in GROUPS:
        if any(needle in kernel for needle in needles):
            return group
    return "other"


def read_launches(path):
    rows = [row for row in csv.reader(open(path, newline="")) if len(row) > 5]
    if not rows:
        raise SystemExit(f"ncu_summary.py: {path} has no rows (did ncu profile anything?)")
    head = rows[0]
    name, time = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    launches = []
    for row in rows[1:]:
        try:
            launches.append((row[name], float(row[time].replace(",", ""))))
        except ValueError:
            continue  # the units row
    return launches


def print_table(title, launches, key, limit):
    sums = collections.defaultdict(lambda: [0, 0.0])
    for kernel, ns in launches:
        entry = sums[key(kernel)]
        entry[0] += 1
        entry[1] += ns
    total = sum(ns for _, ns in sums.values()) or 1.0
    print(f"{title}: {total / 1e6:.2f} ms of kernel time in {len(launches)} launches")
    for label, (count, ns) in sorted(sums.items(), key=lambda item: -item[1][1])[:limit]:
        print(f"  {ns / 1e6:9.3f} ms {100 * ns / total:5.1f}% {count:5d}x  {label}")


def main(arguments):
    if not arguments or any("=" not in argument for argument in arguments):
        raise SystemExit(__doc__)
    for argument in arguments:
        label, path = argument.split("=", 1)
        launches = read_launches(path)
        print_table(f"{label}, the whole run", launches, lambda kernel: "all", 0)
        embeddings = [i for i, (kernel, _) in enumerate(launches) if "embed_kernel" in kernel]
        if len(embeddings) >= 2:
            print_table(f"{label}, the training step", launches[embeddings[0]:embeddings[1]], group_of, 20)
        print_table(f"{label}, by kernel", launches, lambda kernel: kernel[:90], 30)
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
