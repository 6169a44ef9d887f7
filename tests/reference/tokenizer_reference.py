#!/usr/bin/env python3
"""Reference token ids for dufu's tokenizers, from the real implementations: tiktoken's
encode_ordinary (rank files from the bpe-openai and openai-whisper packages, patterns
and special tokens from tiktoken_ext.openai_public), HuggingFace tokenizers (a
tokenizer.json, or GPT-2's vocab.json + merges.txt) and sentencepiece. Run with the
python of scripts/setup_reference_venv.sh.

  corpora OUT_DIR                  real-text test corpora (jsonl) from Debian packages
  train-hf CORPUS... --out DIR     trains byte-level BPE tokenizers with `tokenizers`
  encode KIND MODEL OUT CORPUS...  OUT.<corpus>.ids: a line of ids per document of CORPUS (jsonl)
  expected-shard KIND MODEL CORPUS PREFIX [--append-eod]
                                   PREFIX.bin and PREFIX.lengths: what `dataprep
                                   preprocess` must write (ids + EOD per non-empty
                                   document, in the dtype of Megatron's rule)

KIND is tiktoken (MODEL a .tiktoken file, --pattern gpt2|cl100k|o200k), hf
(tokenizer.json), gpt2-vocab (vocab.json, --merges merges.txt) or spm (.model).
"""
import argparse
import base64
import gzip
import json
import os
import random
import re
import subprocess
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))


# ---------------------------------------------------------------- corpora

def write_jsonl(path, texts):
    with open(path + ".partial", "w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    os.replace(path + ".partial", path)
    print(f"tokenizer_reference: {len(texts)} documents, "
          f"{sum(len(t.encode()) for t in texts) / 1e6:.2f} MB -> {path}", file=sys.stderr)


def fortunes():
    result = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "scripts/corpus/fortunes_to_jsonl.py")],
                            check=True, capture_output=True, text=True)
    return [json.loads(line)["text"] for line in result.stdout.splitlines() if line.strip()]


def kernel(prefix, suffixes, max_bytes, out_dir):
    path = os.path.join(out_dir, "kernel.partial.jsonl")
    subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "scripts/corpus/kernel_source_to_jsonl.py"),
                    "--output", path, "--path-prefix", prefix, "--suffixes", suffixes,
                    "--max-bytes", str(max_bytes), "--allow-fewer"], check=True)
    with open(path, encoding="utf-8") as source:
        texts = [json.loads(line)["text"] for line in source]
    os.remove(path)
    return texts


MAN_PACKAGES = ("manpages-de", "manpages-ru", "manpages-ja", "manpages-zh")


def manual_pages(max_per_package):
    """Translated manual pages (groff source, as shipped): accented Latin, Cyrillic, CJK."""
    texts = []
    for package in MAN_PACKAGES:
        result = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"tokenizer_reference: the Debian package `{package}` is not installed "
                     "(scripts/setup.sh installs it)")
        files = sorted(p for p in result.stdout.splitlines() if p.endswith(".gz") and "/man/" in p)
        size = 0
        for path in files:
            if size >= max_per_package:
                break
            try:
                with gzip.open(path, "rb") as source:
                    text = source.read().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            texts.append(text)
            size += len(text.encode())
    return texts


EDGE_CASES = [
    "", " ", "  ", "   ", "\n", "\n\n\n", "\t", "\t \t", "  \n  ", " \n", "\n ", "\r\n", "\r\n\r\n", "\r",
    "a", "a ", " a", "a  b", "a   ", "word   \n", "   leading", "trailing\t\t", "\u00a0", " \u00a0 x",
    "\u3000\u3000x", "\x0b\x0c", "\u0085", "a\u0085b", "\u2028\u2029", "x\u200by", "\ufeffBOM",
    "\u0301", "e\u0301", "\u0301\u0301a", " \u0301", "\u0301 ", "a\u20dd", "\u0903", "\u093f",
    "👍", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪🇫🇷", "😀😃😄😁", "I ❤️ tokenizers", "⚠️ warning",
    "日本語のテキスト", "中文文本，标点。", "한국어 텍스트", "русский текст", "Ελληνικά", "עברית",
    "العربية النص", "हिन्दी पाठ", "ไทย", "ქართული",
    "'s 'S 't 'T 're 'RE 've 'm 'll 'LL 'd", "it's they're I'll we've", "'ſ 'K 'ſt", "don'T", "'''",
    "1", "12", "123", "1234", "1234567", "3.14159", "1,000,000", "१२३४५", "٣٤٥", "Ⅻ", "½", "x²",
    "<|endoftext|>", "a<|endoftext|>b", "<|fim_prefix|>x<|fim_suffix|>", "<|endofprompt|>", "</s>", "<s>",
    "\U0001F600", "\U00020000", "\U0010FFFD", "\ue000", "\ufffd", "\u00ff\u0100",
    "hello world", "Hello, World!", "HELLO WORLD", "camelCaseWord", "snake_case_word", "x=y+z*2;",
    "if (a && b) { return -1; }", "    indented code", "\tint x;\n\tint y;", "https://example.org/a?b=c",
    "ALLCAPS and lowercase MiXeD", "Ünïcödé Äccents", "ŁÓDŹ", "İstanbul", "ß ẞ", "ǅ ǈ ǋ",
    " " * 200, "\n" * 100, " \n" * 50, "a" * 3000, "=" * 300, "-" * 81, "ab" * 700, "😀" * 100,
    "1" * 100, "\t" * 50 + "x", "x" + " " * 500 + "y",
]


def random_strings(count, seed):
    """Random text over code points assigned in Python's Unicode (14.0, PCRE2 10.42's too),
    mixed with ASCII, spaces, digits, apostrophes and combining marks, so every
    alternative of the patterns is exercised."""
    rng = random.Random(seed)
    assigned = [cp for cp in range(0x110000)
                if unicodedata.category(chr(cp)) not in ("Cn", "Cs")]
    pools = [
        lambda: chr(rng.randrange(0x20, 0x7F)),
        lambda: rng.choice(" \t\n\r\u00a0\u3000\u2028\u0085\x0b\x0c"),
        lambda: rng.choice("0123456789"),
        lambda: rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'"]),
        lambda: chr(rng.randrange(0x300, 0x370)),
        lambda: chr(rng.choice(assigned)),
        lambda: chr(rng.choice(assigned)),
        lambda: chr(rng.randrange(0xA0, 0x250)),
    ]
    texts = []
    for _ in range(count):
        length = rng.choice([1, 2, 3, 5, 8, 13, 40, 120])
        texts.append("".join(rng.choice(pools)() for _ in range(length)))
    return texts


def base64_blob(seed, size):
    rng = random.Random(seed)
    return base64.b64encode(bytes(rng.randrange(256) for _ in range(size))).decode()


def make_corpora(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    write_jsonl(os.path.join(out_dir, "prose.jsonl"), fortunes()[:4000])
    docs = kernel("Documentation/admin-guide/", ".rst,.txt", 1_000_000, out_dir)
    write_jsonl(os.path.join(out_dir, "docs.jsonl"), docs)
    code = kernel("arch/alpha/", ".c,.h,.S", 1_500_000, out_dir)
    write_jsonl(os.path.join(out_dir, "code.jsonl"), code)
    write_jsonl(os.path.join(out_dir, "i18n.jsonl"), manual_pages(300_000))
    write_jsonl(os.path.join(out_dir, "edge.jsonl"),
                EDGE_CASES + random_strings(2000, 12345) + [base64_blob(7, 6000), base64_blob(8, 200)])


# ---------------------------------------------------------------- training

def train_hf(corpora, out_dir, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    def texts():
        for path in corpora:
            with open(path, encoding="utf-8") as source:
                for line in source:
                    yield json.loads(line)["text"]

    os.makedirs(out_dir, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # GPT-2's layout: ByteLevel pre-tokenizer and decoder.
    gpt2 = Tokenizer(models.BPE())
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.train_from_iterator(texts(), trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"], show_progress=False))
    gpt2.save(os.path.join(out_dir, "bytelevel.tokenizer.json"))
    gpt2.model.save(out_dir, "gpt2style")  # gpt2style-vocab.json, gpt2style-merges.txt

    # Llama-3's layout: Split(regex, Isolated) then ByteLevel without its regex, and
    # ignore_merges; the prefix-space variant of ByteLevel on top of it.
    llama_pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    llama = Tokenizer(models.BPE(ignore_merges=True))
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama.decoder = decoders.ByteLevel()
    llama.train_from_iterator(texts(), trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=alphabet,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"], show_progress=False))
    llama.save(os.path.join(out_dir, "split.tokenizer.json"))

    # Qwen2's layout: the NFC normalizer, then Split and ByteLevel like Llama-3's.
    qwen = Tokenizer(models.BPE())
    qwen.normalizer = normalizers.NFC()
    qwen.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    qwen.decoder = decoders.ByteLevel()
    qwen.train_from_iterator(texts(), trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"], show_progress=False))
    qwen.save(os.path.join(out_dir, "nfc.tokenizer.json"))

    prefix = Tokenizer.from_file(os.path.join(out_dir, "bytelevel.tokenizer.json"))
    prefix.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    prefix.save(os.path.join(out_dir, "prefix.tokenizer.json"))
    for name in sorted(os.listdir(out_dir)):
        print("tokenizer_reference: trained", os.path.join(out_dir, name), file=sys.stderr)


# ---------------------------------------------------------------- encoders

def tiktoken_encoding(path, pattern):
    import tiktoken
    import tiktoken_ext.openai_public as openai_public

    ranks = {}
    with open(path, "rb") as source:
        for line in source:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    # r50k_base is GPT-2's encoding, read from a .tiktoken file (gpt2() reads the
    # original vocab.bpe + encoder.json instead).
    constructors = {"gpt2": openai_public.r50k_base, "cl100k": openai_public.cl100k_base,
                    "o200k": openai_public.o200k_base}
    if pattern in constructors:
        # The package's own constructor, with its rank file replaced by ours (it
        # would otherwise download it): its pattern and special tokens as shipped.
        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
        try:
            spec = constructors[pattern]()
        finally:
            openai_public.load_tiktoken_bpe = original
        spec.pop("explicit_n_vocab", None)
        return tiktoken.Encoding(**spec)
    return tiktoken.Encoding(name="custom", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})


class Encoder:
    def __init__(self, kind, model, merges=None, pattern=None):
        self.kind = kind
        if kind == "tiktoken":
            self.encoding = tiktoken_encoding(model, pattern)
            self.encode = self.encoding.encode_ordinary
            self.eod = self.encoding._special_tokens.get("<|endoftext|>")
            self.vocab_size = self.encoding.n_vocab
        elif kind in ("hf", "gpt2-vocab"):
            from tokenizers import Tokenizer, models, pre_tokenizers
            if kind == "hf":
                self.tokenizer = Tokenizer.from_file(model)
            else:
                self.tokenizer = Tokenizer(models.BPE.from_file(model, merges))
                self.tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            # Special tokens in the text are ordinary text; nothing is added around it.
            self.tokenizer.encode_special_tokens = True
            self.encode = lambda text: self.tokenizer.encode(text, add_special_tokens=False).ids
            vocab = self.tokenizer.get_vocab(with_added_tokens=True)
            self.eod = next((vocab[name] for name in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
                             if name in vocab), None)
            self.vocab_size = max(vocab.values()) + 1
        elif kind == "spm":
            import sentencepiece
            self.processor = sentencepiece.SentencePieceProcessor(model_file=model)
            self.encode = self.processor.encode_as_ids
            self.eod = self.processor.eos_id()
            self.vocab_size = self.processor.get_piece_size()
        else:
            sys.exit(f"tokenizer_reference: unknown kind {kind}")


def documents(path):
    with open(path, encoding="utf-8") as source:
        for line in source:
            if line.strip():
                yield json.loads(line)["text"]


def encode_corpora(args):
    encoder = Encoder(args.kind, args.model, args.merges, args.pattern)
    for corpus in args.corpora:
        out_path = f"{args.out}.{os.path.basename(corpus).split('.')[0]}.ids"
        with open(out_path + ".partial", "w") as out:
            for text in documents(corpus):
                out.write(" ".join(map(str, encoder.encode(text))) + "\n")
        os.replace(out_path + ".partial", out_path)


def expected_shard(args):
    import numpy
    encoder = Encoder(args.kind, args.model, args.merges, args.pattern)
    # Megatron's rule: uint16 below 65500 ids, else int32.
    dtype = numpy.uint16 if encoder.vocab_size < 65500 else numpy.int32
    tokens, lengths = [], []
    for text in documents(args.corpus):
        ids = encoder.encode(text)
        if not ids:
            continue
        if args.append_eod:
            ids = ids + [encoder.eod]
        tokens.extend(ids)
        lengths.append(len(ids))
    numpy.array(tokens, dtype=dtype).tofile(args.prefix + ".bin")
    with open(args.prefix + ".lengths", "w") as out:
        out.write(f"{numpy.dtype(dtype).name}\n" + "".join(f"{n}\n" for n in lengths))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    corpora = commands.add_parser("corpora")
    corpora.add_argument("out_dir")
    train = commands.add_parser("train-hf")
    train.add_argument("corpora", nargs="+")
    train.add_argument("--out", required=True)
    train.add_argument("--vocab-size", type=int, default=3000)
    for name in ("encode", "expected-shard"):
        command = commands.add_parser(name)
        command.add_argument("kind", choices=["tiktoken", "hf", "gpt2-vocab", "spm"])
        command.add_argument("model")
        if name == "encode":
            command.add_argument("out", help="writes OUT.<corpus name>.ids for each corpus")
            command.add_argument("corpora", nargs="+")
        else:
            command.add_argument("corpus")
            command.add_argument("prefix")
        command.add_argument("--merges")
        command.add_argument("--pattern")
        if name == "expected-shard":
            command.add_argument("--append-eod", action="store_true")
    args = parser.parse_args()
    if args.command == "corpora":
        make_corpora(args.out_dir)
    elif args.command == "train-hf":
        train_hf(args.corpora, args.out, args.vocab_size)
    elif args.command == "encode":
        encode_corpora(args)
    else:
        expected_shard(args)


if __name__ == "__main__":
    main()
