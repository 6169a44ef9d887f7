#!/usr/bin/env python3
"""Turns Debian's Linux kernel source tarball (package `linux-source-6.1`) into jsonl:
one document per text file, {"text": ..., "path": ...}, in tarball order. It is the
preprocessing benchmark's corpus: real, large, reproducible, and shipped by Debian.
Binary files (a NUL byte) and files that are not valid UTF-8 are skipped. Stops after
--max-bytes of jsonl. The output is written under a temporary name and renamed, so an
interrupted run never leaves a truncated corpus that looks complete. Stdlib only."""
import argparse
import json
import os
import sys
import tarfile

DEFAULT_TARBALL = "/usr/src/linux-source-6.1.tar.xz"


def text_documents(tarball):
    """Yields (path, text) for every regular file of the tarball that is UTF-8 text."""
    with tarfile.open(tarball, mode="r|xz") as archive:
        for member in archive:
            if not member.isfile() or member.size == 0:
                continue
            data = archive.extractfile(member).read()
            if b"\0" in data:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                # Drop the top-level "linux-source-6.1/" so paths read as in a checkout.
                yield member.name.split("/", 1)[-1], text


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tarball", default=DEFAULT_TARBALL)
    parser.add_argument("--output", required=True, help="jsonl file to write")
    parser.add_argument("--max-bytes", type=int, default=150_000_000,
                        help="stop once this many bytes of jsonl are written")
    args = parser.parse_args()

    if not os.path.isfile(args.tarball):
        sys.exit(f"kernel_source_to_jsonl: {args.tarball} not found. "
                 "HINT: run scripts/setup.sh (it installs the Debian package linux-source-6.1)")
    temporary = args.output + ".partial"
    documents = written = text_bytes = 0
    with open(temporary, "w", encoding="utf-8") as out:
        for path, text in text_documents(args.tarball):
            line = json.dumps({"text": text, "path": path}, ensure_ascii=False) + "\n"
            out.write(line)
            documents += 1
            text_bytes += len(text.encode("utf-8"))
            written += len(line.encode("utf-8"))
            if written >= args.max_bytes:
                break
    if written < args.max_bytes:
        sys.exit(f"kernel_source_to_jsonl: only {written} bytes of text in {args.tarball}, "
                 f"fewer than --max-bytes {args.max_bytes}")
    os.replace(temporary, args.output)
    print(f"kernel_source_to_jsonl: {documents} documents, {text_bytes / 1e6:.1f} MB of text, "
          f"{written / 1e6:.1f} MB of jsonl -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
