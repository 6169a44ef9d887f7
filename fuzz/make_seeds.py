#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/: a few small,
valid (and a few slightly broken) files per format, made here from their byte
layouts (docs/formats.md) or by the format's reference tools (numpy, zstd, gzip), never
by dufu's own writers. Deterministic: running it again rewrites the same bytes.

    fuzz/make_seeds.py        (uses /usr/bin/python3 for numpy)
"""
import base64
import gzip
import io
import json
import os
import shutil
import struct
import subprocess
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(directory, name), "wb") as out:
        out.write(data)


TEXT = (
    "A bird in the hand is worth two in the bush.\n"
    "Caf\u00e9 cr\u00e8me, \u65e5\u672c\u8a9e, \U0001F600 and plain ASCII\n"
    "\n"
    "Windows line\r\n"
    "The last line has no newline"
)

# ---- documents -------------------------------------------------------------------
# The document targets choose their options from bits 0-2 of the input size (see
# fuzz/document_input.h); the seeds have sizes that cover the combinations.
put("txt_reader", "lines.txt", TEXT)
put("txt_reader", "empty_lines.txt", "\n\n\nx\n\n")
put("txt_reader", "long_line.txt", "short\n" + "long " * 40 + "\nshort again\n")
put("txt_reader", "bad_utf8.txt", b"good line\n\xff\xfe not UTF-8\n\xc3\xa9 good\n")
put("txt_reader", "crlf_only.txt", "\r\n\r\r\n\r")

JSONL = [
    {"text": "Hello, world.", "meta": "greeting"},
    {"text": "Caf\u00e9 \u65e5\u672c \U0001F600 \"quoted\" \\ tab\t newline\n", "meta": "escapes"},
    {"meta": "no text"},
    {"text": 42, "meta": "number"},
    {"text": {"nested": ["a", 1, None, True]}, "meta": "object"},
]
put("jsonl_reader", "records.jsonl", "".join(json.dumps(r) + "\n" for r in JSONL[:2]))
put("jsonl_reader", "bad_records.jsonl",
    "".join(json.dumps(r) + "\n" for r in JSONL) + "[1, 2]\n{\"text\": \"unterminated\n\n   \n")
put("jsonl_reader", "ascii_escapes.jsonl",
    "".join(json.dumps(r, ensure_ascii=True) + "\r\n" for r in JSONL[:2]))
put("jsonl_reader", "long_text.jsonl",
    json.dumps({"text": "word " * 30, "meta": "m"}) + "\n" + json.dumps({"text": "", "meta": ""}))
put("jsonl_reader", "surrogates.jsonl", '{"text": "\\ud83d\\ude00 \\ud800 lone", "meta": "\\u0000"}\n')
# A key given twice (the second spelled with an escape): json.loads keeps the last.
put("jsonl_reader", "duplicate_keys.jsonl",
    '{"text": "first", "meta": "m1", "text": "second", "meta": "m2"}\n'
    '{"t\\u0065xt": "escaped first", "meta": "m", "text": "plain last"}\n{"text": 1, "text": "string last"}\n')

# ---- compressed streams ------------------------------------------------------------
def zstd(data, *args):
    return subprocess.run(["zstd", "-q", "-c", *args], input=data, stdout=subprocess.PIPE, check=True).stdout


def skippable_frame(payload, nibble=0):
    return struct.pack("<II", 0x184D2A50 | nibble, len(payload)) + payload


text = TEXT.encode("utf-8")
put("zstd_source", "frame.zst", zstd(text, "-19"))
put("zstd_source", "checksum_two_frames.zst", zstd(text, "--check") + zstd(b"second frame\n", "--no-check"))
put("zstd_source", "skippable_first.zst", skippable_frame(b"metadata", 7) + zstd(text))
put("zstd_source", "empty_content.zst", zstd(b""))
put("zstd_source", "repetitive.zst", zstd(b"abcabcabc\n" * 200, "-3"))
put("zstd_source", "truncated.zst", zstd(text)[:-3])
# Found by the target: match offsets past the 1 KiB window the frame declares, which
# ZSTD_decompress decodes and the streaming decoder refuses.
put("zstd_source", "window_exceeded.zst", bytes.fromhex("28b52ffd04006d000020616263 0a0200c3b77c21e6869cb02c98".replace(" ", "")))

def gzip_member(data, name=None, mtime=0, level=9):
    buffer = io.BytesIO()
    with gzip.GzipFile(filename=name or "", mode="wb", fileobj=buffer, mtime=mtime, compresslevel=level) as out:
        out.write(data)
    return buffer.getvalue()


put("gzip_source", "member.gz", gzip_member(text))
put("gzip_source", "named_two_members.gz", gzip_member(text, name="input.txt", mtime=1700000000) +
    gzip_member(b"second member\n"))
put("gzip_source", "stored.gz", gzip_member(b"stored, not compressed\n", level=0))
put("gzip_source", "empty_member.gz", gzip_member(b""))
put("gzip_source", "repetitive.gz", gzip_member(b"abcabcabc\n" * 200))
put("gzip_source", "truncated.gz", gzip_member(text)[:-5])

# ---- shard indices -----------------------------------------------------------------
golden = os.path.join(ROOT, "tests", "data", "golden")
for layout in ("mmidx", "tntidx", "fairseq", "fairseq_int32", "fairseq_mmidx"):
    shutil.copyfile(os.path.join(golden, f"{layout}_example.idx"), os.path.join(CORPUS, "index", f"{layout}.idx"))


def mmidx(dtype_code, item, lengths, documents):
    pointers, at = [], 0
    for length in lengths:
        pointers.append(at)
        at += length * item
    return (b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, dtype_code, len(lengths), len(documents)) +
            struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(lengths)}q", *pointers) +
            struct.pack(f"<{len(documents)}q", *documents))


def tntidx(dtype_code, item, lengths, documents, fairseq=False):
    n = len(lengths)
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    header = b"TNTIDX\0\0" + struct.pack("<QQQQQ", 1, dtype_code, item, n, n)
    if not fairseq:
        header += struct.pack("<Q", len(documents))
    body = struct.pack(f"<{n + 1}q", *range(n + 1)) + struct.pack(f"<{n + 1}q", *offsets) + \
        struct.pack(f"<{n}q", *lengths)
    if not fairseq:
        body += struct.pack(f"<{len(documents)}q", *documents)
    return header + body


# dtype codes: 1 uint8, 4 int32, 5 int64, 8 uint16 (Megatron's table).
put("index", "mmidx_empty.idx", mmidx(8, 2, [], [0]))
put("index", "mmidx_int32_docs.idx", mmidx(4, 4, [3, 0, 5, 1], [0, 2, 4]))
put("index", "tntidx_int64.idx", tntidx(5, 8, [2, 7, 1], [0, 1, 3]))
put("index", "fairseq_uint8.idx", tntidx(1, 1, [4, 4], [], fairseq=True))

# ---- .npy (numpy's own writer) ---------------------------------------------------------
def npy(array, version=None):
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


put("npy", "int32.npy", npy(np.arange(10, dtype="<i4")))
put("npy", "int64_2d.npy", npy(np.arange(12, dtype="<i8").reshape(3, 4)))
put("npy", "float32_scalar.npy", npy(np.array(1.5, dtype="<f4")))
put("npy", "uint16_empty.npy", npy(np.zeros(0, dtype="<u2")))
put("npy", "uint8_v2.npy", npy(np.arange(5, dtype="|u1"), version=(2, 0)))
put("npy", "big_endian.npy", npy(np.arange(3, dtype=">i4")))

# ---- safetensors (the reference layout, written out by hand) ---------------------------
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


put("safetensors", "f32_i64_metadata.safetensors", safetensors(
    [("wte", "F32", [2, 3], struct.pack("<6f", *range(6))), ("step", "I64", [], struct.pack("<q", 7))],
    {"format": "pt", "dufu": "1"}))
put("safetensors", "bf16_u8.safetensors", safetensors(
    [("h.0.ln.weight", "BF16", [4], b"\x80\x3f" * 4), ("mask", "U8", [3], b"\x01\x00\x01"),
     ("empty", "F16", [0, 5], b"")]))
put("safetensors", "header_only.safetensors", safetensors([]))
put("safetensors", "fp8_bool_f64.safetensors", safetensors(
    [("a", "F8_E4M3", [2], b"\x38\x40"), ("b", "BOOL", [1], b"\x01"), ("c", "F64", [1], struct.pack("<d", 2.0))]))

# ---- state.json (a real checkpoint's, trimmed config) ------------------------------------
SHA = "2567799b7f531c08b02330390c2554ab2b8fb458688caef63d27eef68dbc47cc"


def state(version, layout=None, files=None):
    value = {
        "format": "dufu-checkpoint", "version": version, "step": 2, "consumed_samples": 8,
        "consumed_tokens": 64, "skipped_steps": 0, "train_loader_state": "epoch=0 position=8 batches=4",
        "init_seed": 1234, "data_seed": 1234,
        "model": {"n_layer": 2, "n_head": 2, "d_model": 16, "vocab_size": 200, "vocab_multiple": 128,
                  "seq_length": 8},
    }
    if layout is not None:
        value["layout"] = layout
    value["files"] = {name: {"bytes": 42008 + i, "sha256": SHA} for i, name in
                      enumerate(files or ["model.safetensors", "optimizer.safetensors"])}
    value["config_toml"] = "[model]\nn_layer = 2\n\n[data]\nblend = \"tiny\"\n"
    return json.dumps(value, separators=(",", ":"))


SERIAL = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1,
          "optimizer_sharded": False, "pipeline_layers": []}
put("checkpoint_state", "v2_serial.json", state(2, SERIAL))
put("checkpoint_state", "v1.json", state(1))
put("checkpoint_state", "v2_tp2_pp2_zero.json", state(2, {
    "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 2,
    "optimizer_sharded": True, "pipeline_layers": [1, 1]}, files=[
    "model-tp00-pp000.safetensors", "model-tp01-pp000.safetensors", "model-tp00-pp001.safetensors",
    "model-tp01-pp001.safetensors"] + [f"optimizer-tp{t:02d}-pp{p:03d}-dp{d:03d}.safetensors"
                                       for p in range(2) for t in range(2) for d in range(2)]))
put("checkpoint_state", "v2_missing_layout.json", state(2))
# The identity of the shards of the blend, which resume compares.
with_shards = json.loads(state(2, SERIAL))
with_shards["shards"] = [
    {"prefix": "/data/web", "bin_bytes": 123456, "idx_bytes": 3482, "idx_sha256": SHA, "bin_sample_sha256": SHA},
    {"prefix": "books", "bin_bytes": 0, "idx_bytes": 34, "idx_sha256": SHA, "bin_sample_sha256": SHA}]
put("checkpoint_state", "v2_shards.json", json.dumps(with_shards, separators=(",", ":")))

# ---- training configuration ----------------------------------------------------------
# Even sizes are read as a TOML file, odd ones as one override per line.
def even(text):
    return text if len(text.encode()) % 2 == 0 else text + "\n"


def odd(text):
    return text if len(text.encode()) % 2 == 1 else text + "\n"


with open(os.path.join(ROOT, "configs", "quickstart.toml"), encoding="utf-8") as config:
    # The blend the quickstart script gives on the command line, in the file.
    put("training_config", "quickstart.toml",
        even(config.read().replace("\n[data]\n", '\n[data]\nblend = "0.5 fortunes 0.5 linux-docs"\n')))
put("training_config", "small.toml", even(
    '[model]\nn_layer = 2\nn_head = 2\nd_model = 16\nvocab_size = 200\nseq_length = 8\n'
    '[data]\nblend = "0.7 web 0.3 books"\nimpl = "lazy"\nsplit = "98,2,0"\n'
    '[train]\nmicro_batch = 2\nglobal_batch = 4\nsteps = 2\non_nonfinite = "skip"\n'
    '[optim]\nlr = 6e-4\nmin_lr = 6e-5\nwarmup_steps = 1\n'
    '[dist]\npipeline_num_layers = "1,1"\npipeline_parallel_size = 2\n'))
put("training_config", "overrides.txt", odd(
    'model.n_layer=4\noptim.lr=3e-4\ndata.blend="0.7 A 0.3 B"\ndata.paths=["a", "b"]\n'
    'run.dir=/tmp/x\ntrain.steps = 10\noptim.lr=inf\n'))
put("training_config", "inline_tables.toml", even(
    'model = { n_layer = 3, n_head = 3, d_model = 24 }\n"data".blend = \'tiny\'\n'
    'optim.lr = 1_000e-7\ntrain.micro_batch = 0x4\n'))

# ---- tokenizer files (byte-level BPE: every byte a token, a few merges) ----------------
def bytes_to_unicode():
    """GPT-2's byte-level alphabet: printable bytes stand for themselves."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHAR = bytes_to_unicode()
MERGES = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"i", b"n"), (b" ", b"c"), (b"\xc3", b"\xa9")]


def level(raw):
    return "".join(BYTE_CHAR[b] for b in raw)


def merged_tokens():
    tokens = [bytes([b]) for b in range(256)]
    for left, right in MERGES:
        tokens.append(left + right)
    return tokens


ranks = "".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(merged_tokens()))
put("tiktoken", "bytes_and_merges.tiktoken", ranks)
put("tiktoken", "crlf_unordered.tiktoken",
    "".join(f"{base64.b64encode(token).decode()} {rank}\r\n"
            for rank, token in reversed(list(enumerate(merged_tokens())))))
put("tiktoken", "missing_byte.tiktoken", "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(255)))

vocab = {level(token): rank for rank, token in enumerate(merged_tokens())}
merge_lines = [f"{level(left)} {level(right)}" for left, right in MERGES]
put("gpt2_vocab", "vocab_and_merges",
    json.dumps(vocab, ensure_ascii=False) + "\0#version: 0.2\n" + "\n".join(merge_lines) + "\n")
put("gpt2_vocab", "endoftext_crlf",
    json.dumps(dict(vocab, **{"<|endoftext|>": len(vocab)})) + "\0" + "\r\n".join(merge_lines))


def tokenizer_json(pre_tokenizer, merges_as_pairs=False, ignore_merges=False, added=True, decoder=True):
    value = {
        "version": "1.0",
        "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}] if added else [],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        if decoder else None,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab,
                  "merges": [line.split(" ") for line in merge_lines] if merges_as_pairs else merge_lines},
    }
    return json.dumps(value, ensure_ascii=False, indent=1)


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
put("huggingface_json", "gpt2_style.json", tokenizer_json(BYTE_LEVEL))
put("huggingface_json", "llama3_style_split.json", tokenizer_json(
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    merges_as_pairs=True, ignore_merges=True))
# A vocabulary string and the model given twice: tokenizers keeps the last of each.
duplicated = tokenizer_json(BYTE_LEVEL)
put("huggingface_json", "duplicate_keys.json",
    duplicated.replace('"vocab": {', '"vocab": {\n  "th": 3,', 1).replace(
        '\n "model": {', '\n "model": {"type": "WordPiece", "vocab": {}},\n "model": {', 1))
put("huggingface_json", "empty_split_pattern.json", tokenizer_json(
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": ""}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}))
put("gpt2_vocab", "duplicate_keys",
    json.dumps(vocab, ensure_ascii=False).replace("{", '{"th": 5, ', 1) + "\0" + "\n".join(merge_lines) + "\n")
put("huggingface_json", "prefix_space_removed.json", tokenizer_json(
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]},
    added=False, decoder=False))
