"""Long calls of the package stop when told to: Ctrl-C (SIGINT) at a random moment of
dufu.preprocess, and an exception from its progress callback (its last call, with the
final counters, included), end the run before its end and leave the previous output
pair as it was with nothing beside it; a Ctrl-C
while DataLoader waits for a batch raises at once and consumes no batch, and one
while a CausalLMDataset builds its indices stops the building and caches nothing."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import dufu
from conftest import FIXTURE_DIR, write_mmidx_shard
from preprocess_interrupt import files_of, interrupted_runs, make_corpus


def sigint_after(seconds):
    """Sends this process SIGINT from another thread after `seconds`; join the thread."""

    def interrupt():
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt)
    timer.start()
    return timer


@pytest.fixture
def corpus():
    model, jsonl = os.path.join(FIXTURE_DIR, "fortunes.model"), os.path.join(FIXTURE_DIR, "fortunes.jsonl")
    if not (os.path.exists(model) and os.path.exists(jsonl)):
        pytest.skip("the tokenizer fixture (fortunes.model, fortunes.jsonl) is missing: run through ctest")
    return model, jsonl


def test_sigint_at_a_random_moment_keeps_the_previous_pair(corpus, tmp_path):
    model, jsonl = corpus
    # 40 MB of repeated text: about 2 s, which the word cache makes fast.
    big = make_corpus(jsonl, str(tmp_path / "big.jsonl"), 40_000_000)
    # Batches of 64 KiB: the progress counters, which pick the moment, move in small steps.
    duration, latencies = interrupted_runs(model, big, jsonl, str(tmp_path), repetitions=3, workers=2,
                                           batch_bytes=1 << 16)
    print(f"uninterrupted {duration:.2f} s; KeyboardInterrupt after {[round(s, 3) for s in latencies]} s")


def test_a_failing_callback_stops_the_run_and_keeps_the_previous_pair(corpus, tmp_path):
    model, jsonl = corpus
    big = make_corpus(jsonl, str(tmp_path / "big.jsonl"), 4_000_000)
    out = tmp_path / "out"
    out.mkdir()
    dufu.preprocess([jsonl], str(out / "corpus"), model)
    before = files_of(str(out))
    calls = []

    def callback(counters):
        calls.append(counters)
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        dufu.preprocess([big], str(out / "corpus"), model, workers=1, batch_bytes=1 << 12, progress=callback,
                        progress_interval=0.01)
    assert len(calls) == 1
    assert files_of(str(out)) == before


def test_a_callback_failing_at_its_last_call_keeps_the_previous_pair(corpus, tmp_path):
    # Issue 44: the last call (the final counters) came after the new pair had replaced
    # the old one. It comes before the commit now, which waits for its answer.
    model, jsonl = corpus
    out = tmp_path / "out"
    out.mkdir()
    dufu.preprocess([jsonl], str(out / "corpus"), model)
    before = files_of(str(out))
    small = tmp_path / "small.jsonl"
    with open(jsonl, encoding="utf-8") as source:
        small.write_text("".join(source.readlines()[:50]), encoding="utf-8")
    total = os.path.getsize(small)
    calls = []

    def callback(counters):
        calls.append(counters)
        if counters["input_bytes"] == total:
            raise KeyError("at the last call")

    with pytest.raises(KeyError, match="at the last call"):
        dufu.preprocess([str(small)], str(out / "corpus"), model, progress=callback, progress_interval=0.01)
    assert calls and calls[-1]["input_bytes"] == total
    assert files_of(str(out)) == before
    # A callback that returns lets the same run commit, its last call with the final counters.
    calls.clear()
    stats = dufu.preprocess([str(small)], str(out / "corpus"), model, progress=calls.append, progress_interval=60)
    assert calls[-1]["documents"] == stats["documents"] == 50 and calls[-1]["input_bytes"] == total
    assert files_of(str(out)) != before


def test_sigint_while_the_loader_waits_consumes_no_batch(tmp_path):
    # Tiny samples in huge batches: one batch keeps a worker busy long enough for the
    # signal to land while next() waits for it.
    prefix = str(tmp_path / "shard")
    write_mmidx_shard(prefix, [[1000]] * 100)
    dataset = dufu.CausalLMDataset(dufu.IndexedDataset(prefix), seq_length=1, use_cache=False)
    sampler = dufu.SequentialSampler(len(dataset))
    loader = dufu.DataLoader(dataset, sampler, micro_batch=len(dataset) * 8, workers=1, prefetch_batches=1,
                             with_indices=True)
    state = loader.state_dict()

    timer = sigint_after(0.05)
    with pytest.raises(KeyboardInterrupt):
        next(loader)
    timer.join()
    assert loader.state_dict() == state
    _, indices = next(loader)
    assert indices[:5].tolist() == [0, 1, 2, 3, 4]
    assert loader.state_dict()["batches_served"] == 1


def test_sigint_while_building_indices_caches_nothing(tmp_path):
    # Ten million samples of one token: building their indices takes a few tenths of
    # a second, signalled after 20 ms.
    prefix = str(tmp_path / "shard")
    write_mmidx_shard(prefix, [[1000]] * 100)
    shard = dufu.IndexedDataset(prefix)
    cache = tmp_path / "cache"

    timer = sigint_after(0.02)
    with pytest.raises(KeyboardInterrupt):
        dufu.CausalLMDataset(shard, seq_length=1, num_samples=10_000_000, cache_dir=str(cache))
    timer.join()
    assert not cache.exists() or os.listdir(cache) == []
    # The next build finishes and is cached.
    dataset = dufu.CausalLMDataset(shard, seq_length=1, num_samples=1000, cache_dir=str(cache))
    assert len(dataset) >= 1000 and os.path.isdir(dataset.cache_path)


def test_sigint_while_building_a_blend_caches_nothing(tmp_path):
    # A blend of 100 million samples over three datasets: its own indices (one pass, no
    # shuffle) take about a second to build and 1 GB to hold, signalled after 50 ms.
    # Without a stop point the build finishes and is cached before the interrupt is raised.
    prefix = str(tmp_path / "shard")
    write_mmidx_shard(prefix, [[1000]] * 100)
    parts = [dufu.CausalLMDataset(dufu.IndexedDataset(prefix), seq_length=1, use_cache=False) for _ in range(3)]
    cache = tmp_path / "cache"

    timer = sigint_after(0.05)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        dufu.BlendedDataset(parts, [0.5, 0.3, 0.2], size=100_000_000, cache_dir=str(cache), use_cache=True)
    print(f"KeyboardInterrupt {time.monotonic() - started:.3f} s after the start")
    timer.join()
    assert not cache.exists() or os.listdir(cache) == []
    blend = dufu.BlendedDataset(parts, [0.5, 0.3, 0.2], size=1000, cache_dir=str(cache), use_cache=True)
    assert len(blend) == 1000 and os.path.isdir(blend.cache_path)
