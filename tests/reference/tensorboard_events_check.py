#!/usr/bin/env python3
"""TensorBoard's own reader against a run's metrics.jsonl (tests/trainer/tensorboard_events_test.cc).

Runs in the venv of scripts/setup_reference_venv.sh --tensorboard. The scalars are read
with TensorBoard's EventAccumulator from the run directory (every events.out.tfevents.*
file in it, as `tensorboard --logdir` reads them, restarts purged); the expected ones
come from metrics.jsonl: every number or boolean member of a record except "type" and
"step", tagged "TYPE/NAME" (an eval record's "val_" prefix left out), at the record's
step, as a float32; null as NaN. Fails (exit 1, naming the first difference) unless
both hold the same tags with the same (step, value) sequences.

  check RUN_DIR            the events hold exactly the records of metrics.jsonl
  check RUN_DIR --killed   a run killed mid-way: its last metrics line may be cut, and
                           its events may lack the last whole record (the kill can
                           land between the two writes)
  truncated RUN_DIR        copies of the run's newest event file cut inside its last
                           record (in the length, its CRC, the data, the data's CRC)
                           read as the records before it
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
from tensorboard.backend.event_processing import event_accumulator

EVENT_FILE_PREFIX = "events.out.tfevents."


def read_records(run_dir):
    """The whole records of metrics.jsonl (a line cut by a kill ends them)."""
    records = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as lines:
        for line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def expected_scalars(records):
    scalars = {}
    for record in records:
        kind = record["type"]
        for name, value in record.items():
            if name in ("type", "step"):
                continue
            if isinstance(value, bool):
                value = 1.0 if value else 0.0
            elif value is None:
                value = math.nan
            elif not isinstance(value, (int, float)):
                continue
            if kind == "eval" and name.startswith("val_"):
                name = name[len("val_"):]
            scalars.setdefault(f"{kind}/{name}", []).append((record["step"], np.float32(value)))
    return scalars


def read_scalars(log_dir):
    accumulator = event_accumulator.EventAccumulator(log_dir, size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    if accumulator.file_version != 2.0:
        raise SystemExit(f"FAIL: {log_dir}: file_version {accumulator.file_version}, expected brain.Event:2")
    return {tag: [(event.step, np.float32(event.value)) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def same_value(a, b):
    return a.tobytes() == b.tobytes() or (math.isnan(a) and math.isnan(b))


def difference(expected, actual):
    """The first difference between two {tag: [(step, value)]}, or None."""
    if sorted(expected) != sorted(actual):
        return f"tags {sorted(actual)}, expected {sorted(expected)}"
    for tag in sorted(expected):
        want, got = expected[tag], actual[tag]
        if len(want) != len(got):
            return f"{tag}: {len(got)} scalars, expected {len(want)} (steps {[s for s, _ in got]})"
        for (want_step, want_value), (got_step, got_value) in zip(want, got):
            if want_step != got_step or not same_value(want_value, got_value):
                return f"{tag}: step {got_step} value {got_value!r}, expected step {want_step} value {want_value!r}"
    return None


def check(run_dir, killed):
    records = read_records(run_dir)
    kinds = {record["type"] for record in records}
    if not killed and not {"train", "eval"} <= kinds:
        raise SystemExit(f"FAIL: {run_dir}/metrics.jsonl has no train or no eval record")
    if not records:
        raise SystemExit(f"FAIL: {run_dir}/metrics.jsonl has no record")
    actual = read_scalars(run_dir)
    # A killed run may have written its last record to metrics.jsonl only.
    candidates = [len(records), len(records) - 1] if killed else [len(records)]
    for count in candidates:
        if count > 0 and difference(expected_scalars(records[:count]), actual) is None:
            print(f"tensorboard events: {count} records of {len(records)} in metrics.jsonl, "
                  f"{sum(len(v) for v in actual.values())} scalars under {len(actual)} tags: OK")
            return
    raise SystemExit(f"FAIL: {run_dir}: {difference(expected_scalars(records), actual)}")


def record_starts(data):
    """The offsets of the TFRecords in `data`, read from their length fields."""
    starts = []
    offset = 0
    while offset < len(data):
        starts.append(offset)
        (length,) = struct.unpack_from("<Q", data, offset)
        offset += 8 + 4 + length + 4
    if offset != len(data):
        raise SystemExit(f"FAIL: the event file's records end at {offset}, the file at {len(data)}")
    return starts


def truncated(run_dir):
    records = read_records(run_dir)
    names = sorted(name for name in os.listdir(run_dir) if name.startswith(EVENT_FILE_PREFIX))
    if len(names) != 1:
        raise SystemExit(f"FAIL: {run_dir} holds {len(names)} event files, expected 1")
    with open(os.path.join(run_dir, names[-1]), "rb") as file:
        data = file.read()
    last = record_starts(data)[-1]
    (length,) = struct.unpack_from("<Q", data, last)
    expected = expected_scalars(records[:-1])
    with tempfile.TemporaryDirectory() as work:
        for cut in (last + 3, last + 10, last + 12 + length // 2, len(data) - 1):
            log_dir = os.path.join(work, str(cut))
            os.mkdir(log_dir)
            with open(os.path.join(log_dir, names[-1]), "wb") as file:
                file.write(data[:cut])
            problem = difference(expected, read_scalars(log_dir))
            if problem is not None:
                raise SystemExit(f"FAIL: cut at byte {cut} of {len(data)} (last record at {last}): {problem}")
            shutil.rmtree(log_dir)
    print(f"tensorboard events: cut at 4 points inside the last of {len(records)} records, "
          f"the {len(records) - 1} before read: OK")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check")
    check_parser.add_argument("run_dir")
    check_parser.add_argument("--killed", action="store_true")
    truncated_parser = commands.add_parser("truncated")
    truncated_parser.add_argument("run_dir")
    args = parser.parse_args()
    if args.command == "check":
        check(args.run_dir, args.killed)
    else:
        truncated(args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
