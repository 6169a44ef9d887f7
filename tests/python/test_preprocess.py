"""dufu.preprocess against `dataprep preprocess` with the same options on the real-text
fixture (fortunes and its sentencepiece model): byte-identical shards, the stats the
tool reports, progress to a callback, and the tool's error messages."""

import filecmp
import os
import subprocess

import pytest

import dufu
from conftest import FIXTURE_DIR, run_dataprep


@pytest.fixture
def corpus():
    model, jsonl = os.path.join(FIXTURE_DIR, "fortunes.model"), os.path.join(FIXTURE_DIR, "fortunes.jsonl")
    if not (os.path.exists(model) and os.path.exists(jsonl)):
        pytest.skip("the tokenizer fixture (fortunes.model, fortunes.jsonl) is missing: run through ctest")
    return model, jsonl


@pytest.mark.parametrize("impl,layout", [("mmap", "megatron"), ("lazy", "megatron"), ("lazy", "fairseq")])
def test_preprocess_writes_what_the_tool_writes(corpus, tmp_path, impl, layout):
    model, jsonl = corpus
    status, stdout, stderr = run_dataprep("preprocess", "-i", jsonl, "-o", str(tmp_path / "tool"), "-m", model,
                                          "--append-eod", "--impl", impl, "--layout", layout, "--workers", "2",
                                          "--quiet")
    assert status == 0, stderr
    calls = []
    stats = dufu.preprocess([jsonl], str(tmp_path / "py"), model, append_eod=True, impl=impl, layout=layout,
                            workers=2, batch_bytes=1 << 16, progress=calls.append, progress_interval=0.01)
    for suffix in (".bin", ".idx"):
        assert filecmp.cmp(str(tmp_path / "tool") + suffix, str(tmp_path / "py") + suffix, shallow=False)
    assert f"documents  {stats['documents']} written" in stdout
    assert f"tokens     {stats['tokens']} " in stdout
    assert f"dtype {stats['dtype']}" in stdout and stats["output_prefixes"] == [str(tmp_path / "py")]
    # The last call reports the finished job; counters only grow.
    assert calls and calls[-1]["documents"] == stats["documents"] and calls[-1]["tokens"] == stats["tokens"]
    assert calls[-1]["input_bytes"] == os.path.getsize(jsonl)
    assert all(a["tokens"] <= b["tokens"] for a, b in zip(calls, calls[1:]))
    shard = dufu.IndexedDataset(str(tmp_path / "py"), impl)
    assert len(shard) == stats["documents"] and shard.total_tokens == stats["tokens"]
    if layout == "fairseq":
        # fairseq's TNTIDX stores id + 1; items are the ids, as in Megatron's layout.
        dufu.preprocess([jsonl], str(tmp_path / "megatron"), model, append_eod=True, dtype=stats["dtype"])
        megatron = dufu.IndexedDataset(str(tmp_path / "megatron"))
        assert shard.layout != megatron.layout and shard.dtype == megatron.dtype
        for i in range(0, len(shard), 97):
            assert shard[i].tolist() == megatron[i].tolist()


def test_preprocess_reads_parquet_and_arrow_as_the_tool_does(corpus, tmp_path):
    """Issue 41: the package reads the same Parquet and Arrow inputs (written by pyarrow
    in the environment of scripts/setup_arrow.sh) into the tool's bytes."""
    arrow_python = os.environ.get("DUFU_ARROW_PYTHON", "")
    if not arrow_python:
        pytest.skip("this build reads no Parquet or Arrow (no DUFU_ARROW_PYTHON)")
    model, jsonl = corpus
    inputs = tmp_path / "inputs"
    script = os.path.join(os.environ["DUFU_SOURCE_DIR"], "tests", "reference", "parquet_inputs.py")
    subprocess.run([arrow_python, script, jsonl, str(inputs)], check=True, capture_output=True)
    files = [str(inputs / "codec-zstd.parquet"), str(inputs / "stream.arrow")]
    status, _, stderr = run_dataprep("preprocess", "-i", *files, "-o", str(tmp_path / "tool"), "-m", model,
                                     "--json-keys", "text", "title", "--quiet")
    assert status == 0, stderr
    stats = dufu.preprocess(files, str(tmp_path / "py"), model, json_keys=["text", "title"])
    assert stats["documents"] == 2 * 2 * 700
    for key in ("_text_document", "_title_document"):
        for suffix in (".bin", ".idx"):
            assert filecmp.cmp(str(tmp_path / "tool") + key + suffix, str(tmp_path / "py") + key + suffix,
                               shallow=False)
    with pytest.raises(dufu.DufuError, match="with-nulls.parquet: row 5 \\(row group 0\\): null in column 'text'"):
        dufu.preprocess([str(inputs / "with-nulls.parquet")], str(tmp_path / "nulls"), model)


def test_preprocess_errors_carry_the_tools_message(corpus, tmp_path):
    model, jsonl = corpus
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 5}\n')
    status, _, stderr = run_dataprep("preprocess", "-i", str(bad), "-o", str(tmp_path / "tool"), "-m", model, "-q")
    with pytest.raises(dufu.DufuError) as caught:
        dufu.preprocess([str(bad)], str(tmp_path / "py"), model)
    assert status == 1 and str(caught.value) in stderr and "bad.jsonl:2" in str(caught.value)
    assert not os.path.exists(str(tmp_path / "py") + ".bin")
    skipped = dufu.preprocess([str(bad)], str(tmp_path / "py"), model, on_error="skip")
    assert skipped["bad_skipped"] == 1 and skipped["documents"] == 1
    with pytest.raises(dufu.DufuError, match="on_error"):
        dufu.preprocess([str(bad)], str(tmp_path / "py"), model, on_error="ignore")
    with pytest.raises(TypeError, match="progress"):
        dufu.preprocess([str(bad)], str(tmp_path / "py"), model, progress="yes")
