#!/usr/bin/env python3
"""Turns Debian's Linux kernel source tarball (package `linux-source-6.1`) into jsonl:
one document per text file, {"text": ..., "path": ...}, in tarball order. It is the
preprocessing benchmark's corpus: real, large, reproducible, and shipped by Debian.
Binary files (a NUL byte) and files that are not valid UTF-8 are skipped. Stops after
--max-bytes of jsonl. --path-prefix and --suffixes pick a part of the tree (the
quickstart takes the prose of Documentation/ as its second corpus). The output is written under a temporary name and renamed, so an
interrupted run never leaves a truncated corpus that looks complete. Stdlib only."""
import argparse
import json
import os
import sys
import tarfile

DEFAULT_TARBALL = "/usr/src/linux-source-6.1.tar.xz"


def text_documents(tarball, path_prefix="", suffixes=()):
    """Yields (path, text) for every regular file of the tarball that is UTF-8 text,
    under path_prefix and ending in one of suffixes (when given)."""
    seen_prefix = False
    with tarfile.open(tarball, mode="r|xz") as archive:
        for member in archive:
            path = member.name.split("/", 1)[-1]
            if not path.startswith(path_prefix):
                # The tarball is in path order: past the prefix, nothing more matches.
                if seen_prefix:
                    return
                continue
            seen_prefix = True
            if not member.isfile() or member.size == 0:
                continue
            if suffixes and not path.endswith(tuple(suffixes)):
                continue
            data = archive.extractfile(member).read()
            if b"\0" in data:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                # The path without the top-level "linux-source-6.1/", as in a checkout.
                yield path, text


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tarball", default=DEFAULT_TARBALL)
    parser.add_argument("--output", required=True, help="jsonl file to write")
    parser.add_argument("--max-bytes", type=int, default=150_000_000,
                        help="stop once this many bytes of jsonl are written")
    parser.add_argument("--path-prefix", default="",
                        help="only files under this path, e.g. Documentation/")
    parser.add_argument("--suffixes", default="",
                        help="only files ending in one of these, comma-separated, e.g. .rst,.txt")
    parser.add_argument("--allow-fewer", action="store_true",
                        help="write what there is when the selection holds less than --max-bytes")
    args = parser.parse_args()
    suffixes = tuple(s for s in args.suffixes.split(",") if s)

    if not os.path.isfile(args.tarball):
        sys.exit(f"kernel_source_to_jsonl: {args.tarball} not found. "
                 "HINT: run scripts/setup.sh (it installs the Debian package linux-source-6.1)")
    temporary = args.output + ".partial"
    documents = written = text_bytes = 0
    with open(temporary, "w", encoding="utf-8") as out:
        for path, text in text_documents(args.tarball, args.path_prefix, suffixes):
            line = json.dumps({"text": text, "path": path}, ensure_ascii=False) + "\n"
            out.write(line)
            documents += 1
            text_bytes += len(text.encode("utf-8"))
            written += len(line.encode("utf-8"))
            if written >= args.max_bytes:
                break
    if written < args.max_bytes and not args.allow_fewer:
        sys.exit(f"kernel_source_to_jsonl: only {written} bytes of text in {args.tarball}, "
                 f"fewer than --max-bytes {args.max_bytes}")
    os.replace(temporary, args.output)
    print(f"kernel_source_to_jsonl: {documents} documents, {text_bytes / 1e6:.1f} MB of text, "
          f"{written / 1e6:.1f} MB of jsonl -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
