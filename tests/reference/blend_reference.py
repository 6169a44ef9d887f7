#!/usr/bin/env python3
"""Independent reference for blending (docs/index-algorithms.md, section 6; Megatron's
BlendedDataset): the C++ blend must reproduce these arrays exactly.

Reads one case from stdin and writes the results to stdout, one array per line as
"name v1 v2 ...". Cases:
  greedy SIZE            then a line of raw weights (any positive floats)
  exhaustive             then a line of dataset sizes
Greedy output: normalized weights (repr, so they round-trip), per-dataset sizes with
Megatron's 0.5% margin, dataset_index, dataset_sample_index. Exhaustive output: the
size-derived weights and both index arrays.
"""
import math
import sys

import numpy


def normalize(weights):
    # Megatron's megatron.core.datasets.utils.normalize.
    w = numpy.array(weights, dtype=numpy.float64)
    return (w / numpy.sum(w)).tolist()


def dataset_sizes(weights, size):
    # Megatron's _get_size_per_split_per_dataset with margin 0.5 (percent).
    return [int(math.ceil(math.ceil(size * w) * (1 + 0.5 / 100))) for w in weights]


def greedy(weights, size):
    # For many datasets the per-sample scan is vectorized; numpy computes w*x and the
    # subtraction as two separately rounded float64 operations, and argmax returns the
    # first maximum, i.e. ties go to the lowest dataset id.
    w = numpy.array(weights, dtype=numpy.float64)
    counts = numpy.zeros(len(weights), dtype=numpy.float64)
    dataset_index = []
    dataset_sample_index = []
    for s in range(size):
        x = float(max(s, 1))
        if len(weights) <= 16:
            best, best_error = 0, weights[0] * x - counts[0]
            for d in range(1, len(weights)):
                error = weights[d] * x - counts[d]
                if error > best_error:
                    best, best_error = d, error
        else:
            best = int(numpy.argmax(w * x - counts))
        dataset_index.append(best)
        dataset_sample_index.append(int(counts[best]))
        counts[best] += 1
    return dataset_index, dataset_sample_index


def exhaustive(sizes):
    total = sum(sizes)
    weights = [s / float(total) for s in sizes]
    w = numpy.array(weights, dtype=numpy.float64)
    limit = numpy.array(sizes, dtype=numpy.float64)
    counts = [0] * len(sizes)
    dataset_index = []
    dataset_sample_index = []
    for s in range(total):
        x = float(max(s, 1))
        if len(sizes) <= 16:
            best, best_error = None, None
            for d in range(len(sizes)):
                if counts[d] == sizes[d]:
                    continue  # used up (or empty from the start)
                error = weights[d] * x - float(counts[d])
                if best is None or error > best_error:
                    best, best_error = d, error
        else:
            # Used-up datasets get -inf, below every finite error.
            c = numpy.array(counts, dtype=numpy.float64)
            errors = numpy.where(c == limit, -numpy.inf, w * x - c)
            best = int(numpy.argmax(errors))
        dataset_index.append(best)
        dataset_sample_index.append(counts[best])
        counts[best] += 1
    return weights, dataset_index, dataset_sample_index


def emit(name, values):
    sys.stdout.write(name + " " + " ".join(values) + "\n")


def main():
    lines = sys.stdin.read().split("\n")
    mode = lines[0].split()
    if mode[0] == "greedy":
        size = int(mode[1])
        weights = normalize([float(v) for v in lines[1].split()])
        dataset_index, dataset_sample_index = greedy(weights, size)
        emit("weights", [repr(w) for w in weights])
        emit("sizes", [str(n) for n in dataset_sizes(weights, size)])
    elif mode[0] == "exhaustive":
        sizes = [int(v) for v in lines[1].split()]
        weights, dataset_index, dataset_sample_index = exhaustive(sizes)
        emit("weights", [repr(w) for w in weights])
    else:
        sys.exit("unknown mode " + mode[0])
    emit("dataset_index", [str(d) for d in dataset_index])
    emit("dataset_sample_index", [str(i) for i in dataset_sample_index])


if __name__ == "__main__":
    main()
