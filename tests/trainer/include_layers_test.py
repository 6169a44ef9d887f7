"""The trainer's include graph keeps its layers: every #include in trainer/src and
trainer/include/dufu/trainer goes to a file of the same layer or a lower one, in the
order device (device/ with its backends cpu/ and cuda/) < model < parallel <
checkpoint < run; and the files of a backend (cpu/, cuda/) are included from that
backend only. Prints every arrow that breaks them; fails when there is one.

Usage: include_layers_test.py SOURCE_DIR"""
import os
import re
import sys

LAYERS = {"device": 0, "cpu": 0, "cuda": 0, "model": 1, "parallel": 2, "checkpoint": 3, "run": 4}
BACKENDS = ("cpu", "cuda")


def main():
    root = os.path.abspath(sys.argv[1])
    src = os.path.join(root, "trainer", "src")
    include = os.path.join(root, "trainer", "include")
    public = os.path.join(include, "dufu", "trainer")
    files = [os.path.join(d, n) for base in (src, public) for d, _, names in os.walk(base) for n in names]

    def folder(path):
        base = src if path.startswith(src + os.sep) else public
        parts = os.path.relpath(path, base).split(os.sep)
        return parts[0] if len(parts) > 1 else None

    broken = []
    arrows = 0
    for path in sorted(files):
        here = folder(path)
        if here is None or here not in LAYERS:
            broken.append(f"{os.path.relpath(path, root)} is in no layer's folder")
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                match = re.match(r'#include "([^"]+)"', line)
                if not match:
                    continue
                name = match.group(1)
                candidates = [os.path.join(os.path.dirname(path), name), os.path.join(src, name),
                              os.path.join(include, name)]
                target = next((os.path.normpath(c) for c in candidates if os.path.exists(c)), None)
                if target is None or not target.startswith((src + os.sep, public + os.sep)):
                    continue  # another module's header (dufu/common, dufu/dataprep)
                arrows += 1
                there = folder(target)
                if LAYERS.get(there, -1) > LAYERS[here]:
                    broken.append(f"{os.path.relpath(path, root)} ({here}) includes {name} ({there}), a higher layer")
                if there in BACKENDS and there != here:
                    broken.append(f"{os.path.relpath(path, root)} ({here}) includes {name}, a file of the {there} backend")
    for line in broken:
        print(line)
    print(f"{arrows} includes inside the trainer, {len(broken)} against its layers")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
