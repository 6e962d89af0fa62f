#!/usr/bin/env python3
"""The success-path guard: instructions per call of each stack, against a checked-in budget.

Builds the `instructions` bench (release), counts each stack of `benches/instructions.budget`
with valgrind's callgrind (refs for N calls minus refs for 0 calls, over N), and fails when a
stack costs more than 10 % over its budget. Counts are compared relative to the bare call of the
same run, so a toolchain or libc that shifts every stack alike does not trip the guard; what
trips it is a stack that got dearer than the floor it sits on.

    python3 .ci/instructions.py            # check
    python3 .ci/instructions.py --update   # check, then rewrite the budget with today's counts

A deliberate change updates the budget in the same commit, with the reason in the message.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = os.path.join(ROOT, "benches", "instructions.budget")
CALLS = 20_000
TOLERANCE = 0.10


def bench_binary():
    out = subprocess.run(
        ["cargo", "bench", "--locked", "-p", "backstop-benches", "--bench", "instructions",
         "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "instructions":
            return msg["executable"]
    sys.exit("instructions: no bench executable in cargo's output")


def refs(binary, stack, calls):
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", binary, stack,
         str(calls)],
        capture_output=True, text=True,
    )
    if run.returncode != 0:
        sys.exit(f"instructions: {stack} failed under valgrind:\n{run.stderr[-2000:]}")
    match = re.search(r"refs:\s+([\d,]+)", run.stderr)
    if not match:
        sys.exit(f"instructions: no count for {stack}:\n{run.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def per_call(binary, stack):
    return (refs(binary, stack, CALLS) - refs(binary, stack, 0)) // CALLS


def read_budget():
    header, budget = [], {}
    with open(BUDGET) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                header.append(line)
                continue
            name, count = line.split()
            budget[name] = int(count)
    if "bare" not in budget:
        sys.exit("instructions: the budget must list `bare`, the floor every stack is relative to")
    return header, budget


def main():
    update = "--update" in sys.argv[1:]
    header, budget = read_budget()
    binary = bench_binary()
    now = {name: per_call(binary, name) for name in budget}
    # A stack listed with 0 is new: counted, never checked, written by --update.
    scale = now["bare"] / budget["bare"] if budget["bare"] else 1.0
    failed = []
    print(f"{'stack':<26} {'budget':>8} {'now':>8} {'change':>8}")
    for name, allowed in budget.items():
        if not allowed or not budget["bare"]:
            print(f"{name:<26} {'new':>8} {now[name]:>8}")
            continue
        expected = allowed * scale
        change = now[name] / expected - 1
        flag = ""
        if change > TOLERANCE:
            flag = "  OVER BUDGET"
            failed.append(name)
        elif change < -TOLERANCE:
            flag = "  (below budget: lock the gain with --update)"
        print(f"{name:<26} {allowed:>8} {now[name]:>8} {change:>+8.1%}{flag}")
    print(f"(bare call: {budget['bare']} in the budget, {now['bare']} now; counts compared at that scale)")
    if update:
        with open(BUDGET, "w") as f:
            f.writelines(header)
            for name in budget:
                f.write(f"{name} {now[name]}\n")
        print(f"wrote {BUDGET}")
        return
    if failed:
        sys.exit(f"instructions: over budget by more than {TOLERANCE:.0%}: {', '.join(failed)}")


if __name__ == "__main__":
    main()
