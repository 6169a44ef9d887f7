#!/usr/bin/env python3
"""Runs a program whose stderr is a real pseudo-terminal of each given width (set with
TIOCSWINSZ; COLUMNS is removed from the environment, so the width can only come from
the terminal) and replays what it drew on a model of a terminal: the progress bar must
be redrawn in place and never wrap.

The terminal model: printable characters advance the cursor, "\\r" returns it, "\\n"
(turned into "\\r\\n" by the pty) starts a new row, CSI sequences ("\\033[K") move
nothing. A row that reaches the last column counts as wrapped (terminals without
xterm's deferred wrap wrap there).

Checks, at every width: no row reaches the last column; at least --min-frames redraws
("\\r" + text + "\\033[K"); exactly one newline, at the end. With --fills-width, a frame
uses all columns but the last (the bar takes the slack, which shows that the width was
read from the terminal); with --percent, the first frame's percentage is below 100 and
the last frame's is 100.0%. Prints the frames it saw; exit status 1 on a failed check.

usage: progress_pty_test.py --columns 40 80 200 [--fills-width 40 80] [--percent]
                            [--min-frames N] -- COMMAND [ARGS...]
"""
import argparse
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

CSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
PERCENT = re.compile(r"(\d+\.\d)%")


def run_in_pty(command, columns):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.setdefault("DUFU_LOG_LEVEL", "warn")
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    return child.wait(), output


def replay(output, columns):
    """(rows that reached the last column, frames drawn, newlines)."""
    wrapped = []
    frames = []
    newlines = 0
    column = 0
    row_text = ""
    position = 0
    while position < len(output):
        match = CSI.match(output, position)
        if match:
            if match.group() == b"\x1b[K" and row_text:
                frames.append(row_text)
            position = match.end()
            continue
        byte = output[position:position + 1]
        position += 1
        if byte == b"\r":
            column = 0
            row_text = ""
        elif byte == b"\n":
            newlines += 1
            column = 0
            row_text = ""
        else:
            column += 1
            row_text += byte.decode("latin-1")
            if column == columns:
                wrapped.append(row_text)
    return wrapped, frames, newlines


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--columns", type=int, nargs="+", required=True)
    parser.add_argument("--fills-width", type=int, nargs="*", default=[])
    parser.add_argument("--percent", action="store_true")
    parser.add_argument("--min-frames", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    failures = []
    for columns in args.columns:
        status, output = run_in_pty(command, columns)
        wrapped, frames, newlines = replay(output, columns)
        print(f"--- {columns} columns: exit {status}, {len(frames)} frames, {newlines} newline(s)")
        for frame in frames[:2] + frames[-2:]:
            print(f"    |{frame}|")
        if status != 0:
            failures.append(f"{columns}: exit status {status}: {output[-500:]!r}")
        if wrapped:
            failures.append(f"{columns}: {len(wrapped)} row(s) reached the last column, e.g. {wrapped[0]!r}")
        if len(frames) < args.min_frames:
            failures.append(f"{columns}: {len(frames)} frames, fewer than {args.min_frames}")
        if newlines != 1 or not output.endswith(b"\r\n"):
            failures.append(f"{columns}: {newlines} newlines; expected one, at the end")
        if columns in args.fills_width and frames and max(len(f) for f in frames) != columns - 1:
            failures.append(f"{columns}: the widest frame has {max(len(f) for f in frames)} columns, not {columns - 1}")
        if args.percent and frames:
            shown = [PERCENT.search(frame) for frame in frames]
            if not all(shown):
                failures.append(f"{columns}: a frame without a percentage")
            elif float(shown[0].group(1)) >= 100.0 or shown[-1].group(1) != "100.0":
                failures.append(f"{columns}: percentages go from {shown[0].group(1)} to {shown[-1].group(1)}; "
                                "expected below 100 at first and 100.0 at the end")
    for failure in failures:
        print("FAIL " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
