#!/usr/bin/env python3
"""Checks that the README's short tour is what scripts/quickstart.sh runs.

The README promises that its tour's commands are the quickstart's own; this keeps the
promise when either changes. The shell blocks of the README section "A short tour" and
the commands of scripts/quickstart.sh (after its set-up and build, without its `echo`
headers) are each read as a list of commands: continuation lines joined, the
quickstart's variables replaced by what they stand for when run from the repository
root ("$dataprep" -> build/tools/dataprep/dataprep, "$train" ->
build/tools/train/train, "$out" -> quickstart-out, "$root/" -> nothing), quotes
dropped and blanks collapsed. The two lists must be equal, command for command.

Prints the first difference and exits 1 if there is one.
usage: scripts/check_readme_tour.py [REPO_ROOT]"""
import os
import re
import sys

TOUR_HEADING = "## A short tour"
QUICKSTART_VARIABLES = [
    ('"$dataprep"', "build/tools/dataprep/dataprep"),
    ('"$train"', "build/tools/train/train"),
    ("$out", "quickstart-out"),
    ("$root/", ""),
]


def commands_of(lines):
    """The commands of shell `lines`: continuations joined, comments and blanks dropped."""
    commands, pending = [], ""
    for line in lines:
        line = line.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append(pending + line)
        pending = ""
    return commands


def normalised(command):
    for variable, value in QUICKSTART_VARIABLES:
        command = command.replace(variable, value)
    command = command.replace('"', "").replace("'", "")
    return re.sub(r"\s+", " ", command).strip()


def readme_tour_commands(readme):
    text = readme.split(TOUR_HEADING, 1)
    if len(text) != 2:
        sys.exit(f"check_readme_tour: README.md has no section '{TOUR_HEADING}'")
    section = re.split(r"^## ", text[1], maxsplit=1, flags=re.MULTILINE)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    return [normalised(c) for block in blocks for c in commands_of(block.splitlines())]


def quickstart_commands(script):
    lines = script.splitlines()
    # What follows the creation of the output directory is the tour.
    start = next((i for i, line in enumerate(lines) if line.startswith("mkdir -p")), None)
    if start is None:
        sys.exit("check_readme_tour: scripts/quickstart.sh makes no output directory (mkdir -p)")
    commands = commands_of(lines[start:])
    return [normalised(c) for c in commands if not c.startswith("echo ")]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as file:
        readme = readme_tour_commands(file.read())
    with open(os.path.join(root, "scripts", "quickstart.sh"), encoding="utf-8") as file:
        quickstart = quickstart_commands(file.read())
    for index in range(max(len(readme), len(quickstart))):
        mine = readme[index] if index < len(readme) else "(nothing)"
        theirs = quickstart[index] if index < len(quickstart) else "(nothing)"
        if mine != theirs:
            print(f"check_readme_tour: command {index + 1} differs\n  README.md:            {mine}\n"
                  f"  scripts/quickstart.sh: {theirs}")
            return 1
    print(f"check_readme_tour: the README's tour is the quickstart's {len(readme)} commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
