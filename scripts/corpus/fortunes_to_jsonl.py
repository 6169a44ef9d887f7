#!/usr/bin/env python3
"""Turns Debian's fortune cookie files (package `fortunes`) into jsonl: one cookie
per document, in the {"text": ...} form that dataprep and Megatron-LM read.

Only the files of the packages scripts/setup.sh installs are read (`fortunes` and
`fortunes-min`, which it depends on), as `dpkg-query -L` lists them, never whatever
else lies in /usr/share/games/fortunes: other fortune packages (fortunes-de,
fortunes-ru, fortunes-zh, ...) install there too, and reading them would change the
corpus, and so the tokenizer fixture and the quickstart's losses, from machine to
machine."""
import json
import pathlib
import subprocess
import sys

FORTUNE_DIR = pathlib.Path("/usr/share/games/fortunes")
# scripts/setup.sh installs `fortunes`; it depends on `fortunes-min`.
PACKAGES = ("fortunes", "fortunes-min")


def package_files(packages):
    """The paths that dpkg lists for `packages`; exits naming a missing package."""
    files = set()
    for package in packages:
        result = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"fortunes_to_jsonl: the Debian package `{package}` is not installed "
                     f"(scripts/setup.sh installs it)")
        files.update(pathlib.Path(line) for line in result.stdout.splitlines() if line)
    return files


def cookies(path):
    text = path.read_bytes().decode("utf-8", errors="replace")
    for cookie in text.split("\n%\n"):
        cookie = cookie.strip("%\n")
        if cookie.strip():
            yield cookie


def main():
    files = sorted(p for p in package_files(PACKAGES)
                   if p.parent == FORTUNE_DIR and p.is_file() and not p.is_symlink()
                   and p.suffix not in (".dat", ".u8"))
    if not files:
        sys.exit(f"no fortune files of {', '.join(PACKAGES)} in {FORTUNE_DIR}: "
                 f"install the Debian package `fortunes`")
    count = 0
    for path in files:
        for cookie in cookies(path):
            sys.stdout.write(json.dumps({"text": cookie, "source": path.name}) + "\n")
            count += 1
    print(f"fortunes: {count} documents from {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main()
