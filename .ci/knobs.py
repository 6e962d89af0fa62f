#!/usr/bin/env python3
"""Count the configuration knobs of backstop's public API, from api/backstop.txt.

A knob is a public method a user calls to configure something: in the listing, a `pub fn`
whose receiver is `self` by value, that takes at least one argument besides it, and that
returns `Self` or the type it is defined on (with any generic arguments, so a
`classifier<D>(self, d: D) -> RetryConfig<D>` counts). Getters (`&self`), constructors (no
receiver), `build(self)` (no argument) and methods returning another type are not knobs.

Prints the knobs per type and the total. `--max N` fails (exit 1) when the total exceeds N.

Python 3 standard library only.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTING = os.path.join(ROOT, "api", "backstop.txt")
# Value types whose by-value methods compute a new value rather than configure anything
# (`Deadline::min(self, other)` is the earlier of two deadlines).
NOT_CONFIG = {"Deadline"}

# `pub fn <path>::<Type><generics>::<method><generics>(<args>) -> <ret>` (then maybe `  [impl ..]`
# or ` where ..`); the head before `(` is split at the last top-level `::`.
FN = re.compile(r"^pub (?:const )?(?:async )?fn (?P<head>[^(]+)\((?P<args>.*?)\)(?: -> (?P<ret>.+?))?$")
# What the listing appends after a signature: the impl block's header, a where clause.
TAIL = re.compile(r"(  \[impl.*\])?$")
WHERE = re.compile(r" where .*$")


def split_head(head):
    """`a::T<C>::m<D: X>` -> (`a::T<C>`, `m`): the last `::` outside angle brackets."""
    depth, cut = 0, -1
    for i, ch in enumerate(head):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0 and head.startswith("::", i):
            cut = i
    path, method = head[:cut], head[cut + 2:]
    return path, re.sub(r"<.*$", "", method)


def base(path):
    """`backstop::prelude::RetryConfig<C>` -> `RetryConfig`."""
    return re.sub(r"<.*$", "", path).split("::")[-1]


def knobs(lines):
    per_type = defaultdict(list)
    for line in lines:
        m = FN.match(WHERE.sub("", TAIL.sub("", line.rstrip("\n"))))
        if not m:
            continue
        args = [a.strip() for a in split_args(m.group("args"))]
        if len(args) < 2 or args[0] not in ("self", "mut self"):
            continue
        ret = (m.group("ret") or "").strip()
        path, method = split_head(m.group("head"))
        owner = base(path)
        if owner in NOT_CONFIG:
            continue
        if ret != "Self" and base(ret) != owner:
            continue
        per_type[path].append(method)
    return per_type


def split_args(args):
    """Split on top-level commas (generic arguments and closures hold commas of their own)."""
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def main():
    limit = None
    if "--max" in sys.argv:
        limit = int(sys.argv[sys.argv.index("--max") + 1])
    with open(LISTING, encoding="utf-8") as f:
        per_type = knobs(f)
    total = 0
    for owner in sorted(per_type):
        names = sorted(per_type[owner])
        total += len(names)
        print(f"{len(names):3} {owner}: {', '.join(names)}")
    print(f"{total:3} knobs")
    if limit is not None and total > limit:
        print(f"more than {limit} knobs", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
