#!/usr/bin/env python3
"""Fails when an #include "..." under src/ or transports/ points from a lower
layer of the library to a higher one (docs/ARCHITECTURE.md, "Layers").

    scripts/check_layers.py            check the tree (exit 1 on a violation)
    scripts/check_layers.py --list     print every file with its layer

A file may include files of its own layer and of the layers below it, and the
public headers (include/) from anywhere. The two backends, host and CUDA, sit
in one layer and do not include each other. Every source file must be named
by a pattern below, so that a new file is placed on purpose.
"""
import fnmatch
import os
import re
import sys

# Lowest first. Patterns are matched against the path from the repository
# root; the first layer with a matching pattern wins.
LAYERS = [
    ("base", [  # leaf utilities: logging, parameters, checks, sizes, routing math
        "src/debug.*", "src/params.*", "src/checks.h", "src/process.*", "src/float16_bits.h",
        "src/sizes.h", "src/data_types.*", "src/routing.*", "src/ll_layout.h", "src/call_log.*",
        "src/sha256.*",
    ]),
    ("setup", [  # how ranks find each other and reach each other's memory
        "src/socket.*", "src/socket_family.*", "src/bootstrap*", "src/guarded_listener.*", "src/handshake.*", "src/fork_closed_fd.*",
        "src/transport.*", "src/peer_buffers.*", "src/node_map.*",
        "src/topo/*", "src/plan.*", "src/proxy/*", "src/recovery/*", "transports/*/*",
    ]),
    ("backend interface", [  # what a backend sees of its communicator and must implement
        "src/config.*", "src/handle.h", "src/backend_comm.*", "src/backend.h", "src/stager.h",
    ]),
    ("backends", ["src/host/*", "src/cuda/*", "src/cuda_stub.cc"]),
    ("comm", ["src/comm.*"]),  # the communicator: init, destroy, abort
    ("api", ["src/api*"]),  # the public entry points
]

# Groups of one layer that must not include each other.
SEPARATE = [("src/host/*", "src/cuda/*")]

SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".cuh", ".def")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer_of(path):
    for index, (_name, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatch(path, p) for p in patterns):
            return index
    return None


def resolve(including, name):
    """The repository path #include "name" in `including` finds (the compiler's
    order: the including file's directory, then -Isrc, then -Iinclude)."""
    for base in (os.path.dirname(including), "src", "include"):
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(candidate):
            return candidate
    return None


def group_of(path, pair):
    for side, pattern in enumerate(pair):
        if fnmatch.fnmatch(path, pattern):
            return side
    return None


def sources():
    for top in ("src", "transports"):
        for root, _dirs, files in os.walk(top):
            for f in files:
                if f.endswith(SOURCE_SUFFIXES):
                    yield os.path.join(root, f)


def main(argv):
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    files = sorted(sources())
    problems = []
    for path in files:
        if layer_of(path) is None:
            problems.append(f"{path}: in no layer: name it in scripts/check_layers.py (LAYERS)")
    if "--list" in argv:
        for path in files:
            index = layer_of(path)
            print(f"{LAYERS[index][0] if index is not None else '?':18s} {path}")
        return 0
    chain = " < ".join(f"`{name}`" for name, _ in LAYERS)
    if chain not in open("docs/ARCHITECTURE.md", encoding="utf-8").read():
        problems.append(f"docs/ARCHITECTURE.md does not name the layers in order as {chain}")
    for path in files:
        mine = layer_of(path)
        if mine is None:
            continue
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(path, m.group(1))
            where = f'{path}:{number}: #include "{m.group(1)}"'
            if target is None:
                problems.append(f"{where}: not found under the including file's directory, src/ or include/")
                continue
            if target.startswith("include" + os.sep):
                continue  # the public headers: every layer may use them
            theirs = layer_of(target)
            if theirs is None:
                continue  # reported above
            if theirs > mine:
                problems.append(f"{where}: {LAYERS[mine][0]} includes {target}, which is in {LAYERS[theirs][0]}, "
                                "a higher layer")
            for pair in SEPARATE:
                a, b = group_of(path, pair), group_of(target, pair)
                if a is not None and b is not None and a != b:
                    problems.append(f"{where}: {pair[a]} and {pair[b]} do not include each other")
    for p in problems:
        print(p)
    layers = " < ".join(name for name, _ in LAYERS)
    if problems:
        print(f"check_layers: {len(problems)} problems (layers, lowest first: {layers})")
        return 1
    print(f"check_layers: {len(files)} files, every include points to its own layer or a lower one ({layers})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
