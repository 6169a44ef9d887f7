#!/usr/bin/env python3
"""Checks the include graph against the architecture's layers (docs/architecture.md):

- libraries point one way: common <- dataprep <- trainer <- tools, python;
- inside the trainer, a folder includes only its own layer or lower ones
  (TRAINER_LAYERS, lowest first): no backend reaches up to the model; and a backend's
  files (cpu/, cuda/) are included by that backend only;
- inside dataprep, a folder of src/ includes only its own layer or lower ones
  (DATAPREP_LAYERS, lowest first), and two folders of one layer include neither the
  other; a public header (include/dufu/dataprep/, flat) is of the folder of its
  source; and no two rooms include each other, directly or round a loop (a room is a
  header and the source of the same name);
- the model room knows no data-parallel storage: no identifier of its code (comments
  and strings aside) names a window, sink, prefetch or parameter gather
  (MODEL_FOREIGN_WORDS); those are the parameter store's (parallel/).

Prints every arrow that breaks a rule, with the line, and exits 1 if there is one.
usage: scripts/check_layers.py [REPO_ROOT]"""
import os
import re
import sys
from collections import defaultdict

LIBRARY_ORDER = ["common", "dataprep", "trainer", "tools", "python"]

# Trainer folders (of src/ and include/dufu/trainer/), lowest layer first. Every
# trainer file sits in one of them.
TRAINER_LAYERS = [
    {"device", "cpu", "cuda"},
    {"model"},
    {"parallel"},
    {"checkpoint"},
    {"run"},
]
TRAINER_BACKENDS = ("cpu", "cuda")

# Dataprep folders (of src/), lowest layer first; folders of one layer are side by side
# and include neither the other. Every dataprep source sits in one of them; a public
# header (include/dufu/dataprep/x.h) is of the folder of its source (src/<folder>/x.cc),
# or of DATAPREP_FOLDER_OF_HEADER's when it has none.
DATAPREP_LAYERS = [
    {"input"},
    {"tokenizers"},
    {"shards"},
    {"preprocess", "datasets"},
]
DATAPREP_FOLDER_OF_HEADER = {"token_dataset": "datasets", "tokenizer_model": "tokenizers", "reader_options": "input"}

# Files of a room named otherwise: preprocess's private header (the parts divided runs
# reuse) and the sidecar it writes from its options, both parts of the preprocess room;
# the causal-LM index build's shared pieces, part of the dataset's room.
DATAPREP_ROOM_OF_HEADER = {"preprocess_pipeline": "preprocess", "preprocess_sidecar": "preprocess",
                           "causal_lm_indices": "causal_lm_dataset"}

# Words of ZeRO's machinery that no identifier in the trainer's model room may hold.
MODEL_FOREIGN_WORDS = re.compile(r"[A-Za-z_0-9]*(window|sink|prefetch|gather_param|shard_param)[A-Za-z_0-9]*",
                                 re.IGNORECASE)
COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.DOTALL)


def model_foreign_identifiers(text):
    """The identifiers of C++ `text`, comments and string literals removed, that name ZeRO's machinery."""
    return sorted({m.group(0) for m in MODEL_FOREIGN_WORDS.finditer(COMMENT_OR_STRING.sub(" ", text))})


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".cpp", ".hpp")


def library_of(path):
    top = path.split("/", 1)[0]
    return top if top in LIBRARY_ORDER else None


def resolve(root, including, name):
    library = library_of(including)
    candidates = [os.path.join(os.path.dirname(including), name)]
    if library in ("common", "dataprep", "trainer"):
        candidates.append(os.path.join(library, "src", name))
    candidates += [os.path.join(lib, "include", name) for lib in ("common", "dataprep", "trainer")]
    for candidate in candidates:
        candidate = os.path.normpath(candidate)
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def room_path(path, library):
    """The path inside the library with src/ and include/dufu/<library>/ removed."""
    for prefix in (f"{library}/src/", f"{library}/include/dufu/{library}/"):
        if path.startswith(prefix):
            return path[len(prefix):]
    return None


def trainer_folder(path):
    inner = room_path(path, "trainer")
    if inner is None:
        return None
    return inner.split("/", 1)[0] if "/" in inner else ""


def trainer_layer(path):
    folder = trainer_folder(path)
    for rank, folders in enumerate(TRAINER_LAYERS):
        if folder in folders:
            return rank
    return None


def dataprep_room(path):
    inner = room_path(path, "dataprep")
    if inner is None:
        return None
    room = os.path.splitext(os.path.basename(inner))[0]
    return DATAPREP_ROOM_OF_HEADER.get(room, room)


def dataprep_folders_of_sources(root):
    """The folder of each source of dataprep/src, by its name without the suffix."""
    folders = {}
    source = os.path.join(root, "dataprep", "src")
    for directory, _, names in os.walk(source):
        inner = os.path.relpath(directory, source)
        if inner == ".":
            continue
        for name in names:
            if name.endswith(SOURCE_SUFFIXES):
                folders.setdefault(os.path.splitext(name)[0], inner.split(os.sep, 1)[0])
    return folders


def dataprep_folder(path, folders_of_sources):
    if path.startswith("dataprep/src/"):
        inner = room_path(path, "dataprep")
        return inner.split("/", 1)[0] if "/" in inner else None
    if path.startswith("dataprep/include/dufu/dataprep/"):
        room = os.path.splitext(os.path.basename(path))[0]
        return folders_of_sources.get(room, DATAPREP_FOLDER_OF_HEADER.get(room))
    return None


def dataprep_layer(folder):
    for rank, folders in enumerate(DATAPREP_LAYERS):
        if folder in folders:
            return rank
    return None


def strongly_connected(graph):
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for next_node in graph[node]:
            if next_node not in index:
                visit(next_node)
                low[node] = min(low[node], low[next_node])
            elif next_node in on_stack:
                low[node] = min(low[node], index[next_node])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(component)

    for node in list(graph):
        if node not in index:
            visit(node)
    return components


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    sys.setrecursionlimit(10000)
    problems = []
    unplaced = set()
    dataprep_graph = defaultdict(set)
    dataprep_arrows = defaultdict(list)
    folders_of_sources = dataprep_folders_of_sources(root)
    files = 0
    for library in LIBRARY_ORDER:
        for directory, _, names in os.walk(os.path.join(root, library)):
            for name in sorted(names):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(directory, name), root)
                files += 1
                if library == "dataprep" and room_path(path, "dataprep") is not None:
                    if dataprep_layer(dataprep_folder(path, folders_of_sources)) is None:
                        unplaced.add(path)
                with open(os.path.join(root, path), encoding="utf-8") as source:
                    for number, line in enumerate(source, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        target = resolve(root, path, match.group(1))
                        if target is None:
                            continue  # a third-party or generated header
                        where = f"{path}:{number}: includes {target}"
                        target_library = library_of(target)
                        if LIBRARY_ORDER.index(target_library) > LIBRARY_ORDER.index(library):
                            problems.append(f"{where} ({library} must not depend on {target_library})")
                        if library == "trainer" and target_library == "trainer":
                            from_layer, to_layer = trainer_layer(path), trainer_layer(target)
                            for placed, layer in ((path, from_layer), (target, to_layer)):
                                if layer is None and room_path(placed, "trainer") is not None:
                                    unplaced.add(placed)
                            if from_layer is not None and to_layer is not None and to_layer > from_layer:
                                problems.append(f"{where} (a lower trainer layer reaches up)")
                            from_folder, to_folder = trainer_folder(path), trainer_folder(target)
                            if to_folder in TRAINER_BACKENDS and from_folder != to_folder:
                                problems.append(f"{where} (a file of the {to_folder} backend, used outside it)")
                        if library == "dataprep" and target_library == "dataprep":
                            from_folder = dataprep_folder(path, folders_of_sources)
                            to_folder = dataprep_folder(target, folders_of_sources)
                            from_layer, to_layer = dataprep_layer(from_folder), dataprep_layer(to_folder)
                            if from_layer is not None and to_layer is not None:
                                if to_layer > from_layer:
                                    problems.append(f"{where} (dataprep's {from_folder}/ reaches up to {to_folder}/)")
                                elif to_layer == from_layer and from_folder != to_folder:
                                    problems.append(f"{where} (dataprep's {from_folder}/ and {to_folder}/ are side by "
                                                    "side: neither includes the other)")
                            from_room, to_room = dataprep_room(path), dataprep_room(target)
                            if from_room and to_room and from_room != to_room:
                                dataprep_graph[from_room].add(to_room)
                                dataprep_graph.setdefault(to_room, set())
                                dataprep_arrows[(from_room, to_room)].append(where)
    for folder in ("trainer/src/model", "trainer/include/dufu/trainer/model"):
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            with open(os.path.join(root, folder, name), encoding="utf-8") as source:
                foreign = model_foreign_identifiers(source.read())
            if foreign:
                problems.append(f"{folder}/{name}: the model room names the parameter store's machinery "
                                f"({', '.join(foreign)}); it belongs in parallel/ (parameter_store.h)")
    for component in strongly_connected(dataprep_graph):
        if len(component) > 1:
            members = set(component)
            arrows = [w for (a, b), ws in dataprep_arrows.items() if a in members and b in members for w in ws]
            problems.append("dataprep rooms that include each other: " + ", ".join(sorted(members)) + "\n    " +
                            "\n    ".join(sorted(arrows)))
    for path in sorted(unplaced):
        if path.startswith("dataprep/"):
            problems.append(f"{path}: in no dataprep folder (scripts/check_layers.py, DATAPREP_LAYERS, "
                            "DATAPREP_FOLDER_OF_HEADER)")
        else:
            problems.append(f"{path}: in no trainer layer (scripts/check_layers.py, TRAINER_LAYERS)")
    for problem in problems:
        print(problem)
    print(f"check_layers: {files} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
