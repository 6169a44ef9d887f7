"""A .bin cut shorter while a dataset over it is alive: every read through the package
(items, views handed out, samples, the loader) raises DufuError naming the file, in
every impl, where reading a shrunk mapping used to kill the interpreter with SIGBUS.
Each case runs in a child interpreter, so that a crash is a failure and not the end
of the test run."""

import os
import subprocess
import sys

import pytest

from conftest import write_mmidx_shard

CHILD = r"""
import os, sys
import dufu
prefix, impl = sys.argv[1], sys.argv[2]
shard = dufu.IndexedDataset(prefix, impl)
dataset = dufu.CausalLMDataset(shard, seq_length=64, use_cache=False)
last = len(shard) - 1
os.truncate(prefix + ".bin", os.path.getsize(prefix + ".bin") // 2)
reads = {
    "last item": lambda: shard[last],
    "first item": lambda: shard[0],
    "get": lambda: shard.get(last, 1, 2),
    "sample": lambda: dataset[len(dataset) - 1],
    "batch": lambda: dataset.get_batch([0, len(dataset) - 1]),
    "loader": lambda: next(dufu.DataLoader(dataset, dufu.SequentialSampler(len(dataset)), micro_batch=4)),
}
if impl == "mmap":
    reads["bin_buffer"] = lambda: shard.bin_buffer
for name, read in reads.items():
    try:
        read()
    except dufu.DufuError as error:
        message = str(error)
        assert "was truncated while open" in message and prefix + ".bin" in message, message
        print(name, "raised")
    else:
        print(name, "did not raise")
"""


@pytest.mark.parametrize("impl", ["mmap", "lazy", "cached"])
def test_every_read_of_a_truncated_shard_raises(tmp_path, impl):
    prefix = str(tmp_path / "shard")
    write_mmidx_shard(prefix, [[300, 200], [500], [400, 100, 250]])
    child = subprocess.run([sys.executable, "-c", CHILD, prefix, impl], capture_output=True, text=True,
                           env=dict(os.environ, DUFU_CACHE_DIR=str(tmp_path / "cache")))
    assert child.returncode == 0, f"exit {child.returncode} (negative: killed by that signal)\n{child.stderr}"
    lines = child.stdout.splitlines()
    assert lines and all(line.endswith(" raised") for line in lines), child.stdout
    assert len(lines) == (7 if impl == "mmap" else 6)
