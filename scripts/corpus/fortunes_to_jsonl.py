#!/usr/bin/env python3
"""Turns Debian's fortune cookie files (package `fortunes`) into jsonl: one cookie
per document, in the {"text": ...} form that dataprep and Megatron-LM read."""
import json
import pathlib
import sys

FORTUNE_DIR = pathlib.Path("/usr/share/games/fortunes")


def cookies(path):
    text = path.read_bytes().decode("utf-8", errors="replace")
    for cookie in text.split("\n%\n"):
        cookie = cookie.strip("%\n")
        if cookie.strip():
            yield cookie


def main():
    files = sorted(p for p in FORTUNE_DIR.iterdir()
                   if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8"))
    if not files:
        sys.exit(f"no fortune files in {FORTUNE_DIR}: install the Debian package `fortunes`")
    count = 0
    for path in files:
        for cookie in cookies(path):
            sys.stdout.write(json.dumps({"text": cookie, "source": path.name}) + "\n")
            count += 1
    print(f"fortunes: {count} documents from {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main()
