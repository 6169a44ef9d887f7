#!/usr/bin/env python3
"""Checks every relative link of README.md, CHANGELOG.md and docs/*.md.

A link [text](target) whose target is not a URL must name a file or directory that
exists (relative to the page), and a #fragment must be a heading of the page it
points to (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens,
repeats numbered -1, -2, ...). Links inside code blocks and inline code are not links.

usage: check_doc_links.py [REPOSITORY_ROOT]     exit 1, listing each broken link
"""
import glob
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^()\s>]*(?:\([^()\s]*\))?[^()\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def strip_code(text):
    """The text without fenced code blocks and inline code (replaced by blanks)."""
    out = []
    fence = None
    for line in text.split("\n"):
        match = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            out.append("")
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
            continue
        out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line))
    return "\n".join(out)


def slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found = set()
        counts = {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fence = None
        for line in text.split("\n"):
            match = re.match(r"^\s*(`{3,}|~{3,})", line)
            if fence is None and match:
                fence = match.group(1)[0] * len(match.group(1))
                continue
            if fence is not None:
                if line.strip().startswith(fence):
                    fence = None
                continue
            heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if heading:
                base = slug(heading.group(1))
                n = counts.get(base, 0)
                counts[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
        cache[path] = found
    return cache[path]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    pages = [os.path.join(root, name) for name in ("README.md", "CHANGELOG.md")]
    pages += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    broken = []
    checked = 0
    for page in pages:
        if not os.path.exists(page):
            continue
        with open(page, encoding="utf-8") as f:
            text = strip_code(f.read())
        for number, line in enumerate(text.split("\n"), 1):
            for match in LINK.finditer(line):
                target = match.group(1)
                if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # a URL (https:, mailto:, ...)
                checked += 1
                where = f"{os.path.relpath(page, root)}:{number}: ({target})"
                file_part, _, fragment = target.partition("#")
                destination = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) if file_part else page
                if not os.path.exists(destination):
                    broken.append(f"{where}: no file {os.path.relpath(destination, root)}")
                    continue
                if fragment and destination.endswith(".md") and fragment not in anchors(destination):
                    broken.append(f"{where}: no heading #{fragment} in {os.path.relpath(destination, root)}")
    for line in broken:
        print(line)
    if broken:
        print(f"check_doc_links.py: {len(broken)} of {checked} relative links point nowhere")
        return 1
    print(f"check_doc_links.py: {checked} relative links in {len(pages)} pages resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
