#!/usr/bin/env python3
"""Ctrl-C at a random moment of dufu.preprocess: each run must raise KeyboardInterrupt
(not finish), within a second of the signal, and leave the previous output pair
byte for byte as it was, with no temporary or lock file beside it.

Imported by test_interrupt.py (a few MB, 3 runs); run as a script for the issue's
acceptance check (100 MB, 20 runs), from a build tree:

    PYTHONPATH=build/python python3 tests/python/preprocess_interrupt.py \\
        --model build/test-fixtures/fortunes.model --source build/test-fixtures/fortunes.jsonl
"""

import argparse
import os
import random
import signal
import sys
import threading
import time

import dufu


def make_corpus(source, path, size_bytes):
    """Writes `source`'s lines again and again into `path` until it holds size_bytes."""
    with open(source, "rb") as lines:
        block = lines.read()
    with open(path, "wb") as out:
        written = 0
        while written < size_bytes:
            out.write(block)
            written += len(block)
    return path


def files_of(directory):
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def interrupted_runs(model, corpus, previous_corpus, work_dir, repetitions, seed=1, workers=2, batch_bytes=1 << 20):
    """Runs dufu.preprocess of `corpus` over a pair made from `previous_corpus`,
    SIGINT landing at a random moment of each run. Returns the seconds from each
    signal to the KeyboardInterrupt; raises AssertionError if a run finished, or the
    pair or the folder changed."""
    measure_dir = os.path.join(work_dir, "measure")
    out_dir = os.path.join(work_dir, "out")
    os.makedirs(measure_dir, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    start = time.monotonic()
    dufu.preprocess([corpus], os.path.join(measure_dir, "whole"), model, workers=workers, batch_bytes=batch_bytes)
    duration = time.monotonic() - start
    prefix = os.path.join(out_dir, "corpus")
    dufu.preprocess([previous_corpus], prefix, model, workers=workers)
    before = files_of(out_dir)
    assert sorted(before) == ["corpus.bin", "corpus.dufu.json", "corpus.idx"], sorted(before)

    rng = random.Random(seed)
    total = os.path.getsize(corpus)
    latencies = []
    for run in range(repetitions):
        # The moment is a random share of the work done (5-50 %), as the progress
        # counters tell it, not of a time measured on an earlier run: on a loaded
        # machine a delay could land after the end. The counters lag the work by up to
        # a poll (50 ms), so a later moment could be after the end on a small corpus.
        share = rng.uniform(0.05, 0.5)
        done = [0]
        signalled = []
        finished = threading.Event()

        def interrupt():
            while done[0] < share * total and not finished.is_set():
                time.sleep(0.001)
            # The callback's last call reports the finished job.
            if done[0] < total and not finished.is_set():
                signalled.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)

        def progress(counters):
            done[0] = counters["input_bytes"]

        timer = threading.Thread(target=interrupt)
        timer.start()
        try:
            dufu.preprocess([corpus], prefix, model, workers=workers, batch_bytes=batch_bytes, progress=progress,
                            progress_interval=0.01)
        except KeyboardInterrupt:
            raised = time.monotonic()
        else:
            finished.set()
            timer.join()
            raise AssertionError(f"run {run}: preprocess ran to its end through a SIGINT at {share:.0%} of the input")
        finished.set()
        timer.join()
        assert signalled, f"run {run}: KeyboardInterrupt without a signal, or after the job's end"
        latencies.append(raised - signalled[0])
        after = files_of(out_dir)
        assert sorted(after) == sorted(before), f"run {run}: the folder holds {sorted(after)}, not {sorted(before)}"
        assert after == before, f"run {run}: the previous pair changed"
    return duration, latencies


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="tokenizer model (e.g. the fixture's fortunes.model)")
    parser.add_argument("--source", required=True, help="jsonl repeated into the corpus")
    parser.add_argument("--megabytes", type=float, default=100)
    parser.add_argument("--repetitions", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work-dir", default="/tmp/dufu-preprocess-interrupt")
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    corpus = make_corpus(args.source, os.path.join(args.work_dir, "corpus.jsonl"), int(args.megabytes * 1e6))
    duration, latencies = interrupted_runs(args.model, corpus, args.source, args.work_dir, args.repetitions,
                                           workers=args.workers)
    print(f"{args.megabytes:g} MB, uninterrupted run {duration:.2f} s; {len(latencies)} runs interrupted, "
          f"KeyboardInterrupt after {min(latencies) * 1e3:.0f} to {max(latencies) * 1e3:.0f} ms "
          f"(mean {sum(latencies) / len(latencies) * 1e3:.0f} ms); previous pair byte-equal, no temporaries")
    return 0 if max(latencies) < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
