#!/usr/bin/env python3
"""No import circle between the rooms of the crate: the onion is a one-way street.

A room is a top-level module of a crate under crates/ (`classify`, `wire`, `deadline`,
`idempotency`, …), or a module one level down in `client/` and `server/` (`client/retry`,
`client/breaker`, `server/admission`, …); the crate root and `client/mod.rs`,
`server/mod.rs` (the builders) are rooms of their own. Every file is read; a path to another
module (`use crate::a::B`, `use crate::{a::B, C}`, `super::b::C`, `crate::X` resolved through
the `pub use` re-exports that name it) is an edge from its file's room to the room it names.
Paths to a module's own ancestors, and `pub use` re-exports (both are for users), are not
edges. Comments, doc
links and test modules (`#[cfg(test)] mod tests { … }`, or a file declared `#[cfg(test)] mod
name;`) are not read: a test may build the whole stack. Fails, listing the rooms and the files that
close it, when the edges between rooms close a circle. (Files inside one room may need each
other: a config builds its layer, the layer keeps its config.)

    python3 .ci/imports.py
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = re.compile(r"\b(crate|super)((?:::\w+)*)(?:::\{([^;]*?)\})?")
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*;")
REEXPORT = re.compile(r"pub(?:\([\w:]+\))?\s+use\s+([\w:]+)::\{?([\w,\s:]+)\}?;")


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def absolute(module, base):
    head, rest = base[0], base[1:]
    if head == "crate":
        return tuple(rest)
    if head == "self":
        return module + tuple(rest)
    if head == "super":
        return module[:-1] + tuple(rest)
    return module + tuple(base)


def edges_of(src):
    files = {}
    for folder, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(folder, name)
                files[module_of(src, path)] = path
    # Test modules in files of their own (`#[cfg(test)] mod name;`): test code, not read.
    tests = set()
    for module, path in files.items():
        text = open(path, encoding="utf-8").read()
        for found in TEST_MOD.finditer(text):
            tests.add(module + (found.group(1),))
    code = {m: ("" if m in tests else code_of(p)) for m, p in files.items()}
    reexports = {}
    for module, text in code.items():
        for found in REEXPORT.finditer(text):
            target = absolute(module, found.group(1).split("::"))
            for item in re.split(r"[,\s]+", found.group(2)):
                item = item.split("::")[-1].strip()
                if item and item != "self":
                    reexports[(module, item)] = target

    def resolve(path, depth=0):
        for cut in range(len(path), -1, -1):
            module = tuple(path[:cut])
            if module in files:
                target = reexports.get((module, path[cut])) if cut < len(path) else None
                if target is not None and target != module and depth < 8:
                    return resolve(list(target) + list(path[cut + 1 :]), depth + 1)
                return module
        return ()

    edges = {m: set() for m in files}
    for module, text in code.items():
        # A `pub use` re-exports for users (`backstop::deadline::DeadlineLayer`): not a need.
        text = re.sub(r"pub\s+use\s+[^;]*;", "", text)
        for found in PATH.finditer(text):
            base = [] if found.group(1) == "crate" else list(module[:-1])
            parts = [p for p in found.group(2).strip(":").split("::") if p]
            items = [None]
            if found.group(3):
                items = [i.strip().split("::")[0].split(" ")[0] for i in found.group(3).split(",")]
            for item in items:
                target = resolve(base + parts + ([item] if item and item != "self" else []))
                # Ancestors re-export for users: a path through them is not a dependency.
                if target != module[: len(target)]:
                    edges[module].add(target)
    return edges


def circles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)
    return found


def room(module):
    if len(module) > 1 and module[0] in ("client", "server"):
        return module[:2]
    return module[:1]


def main():
    failed = False
    crates = os.path.join(ROOT, "crates")
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, "src")
        if not os.path.isdir(src):
            continue
        edges = edges_of(src)
        rooms, why = {}, {}
        for module, targets in edges.items():
            rooms.setdefault(room(module), set())
            for target in targets:
                if room(target) != room(module):
                    rooms[room(module)].add(room(target))
                    why.setdefault((room(module), room(target)), []).append((module, target))
        for target in list(rooms.values()):
            for r in target:
                rooms.setdefault(r, set())
        for component in circles(rooms):
            failed = True
            print(f"imports: a circle between the rooms of {crate}:")
            for r in sorted(component):
                for into in sorted(t for t in rooms[r] if t in component):
                    files = sorted({"/".join(m) + " -> " + "/".join(t) for m, t in why[(r, into)]})
                    print(f"  {'/'.join(r) or 'lib'} -> {'/'.join(into) or 'lib'}: {'; '.join(files[:3])}")
    if failed:
        sys.exit(1)
    print("imports: no circle between the rooms of any crate")


if __name__ == "__main__":
    main()
