"""The instructions of the lean select alone, per lean task: ``scripts/select_passes.py``'s
loop (one reconciler's passes over the e2e dataset, shard 0 of 2) where every call the lean
path covers is decided ``REPEAT`` extra times (``lean.decide`` has no effect but its memo,
warm after the first call), so that under callgrind

    (instructions with REPEAT=1 - with REPEAT=0) / lean tasks

is what one lean decision costs, steady state. Prints the lean task count.

Usage: ``REPEAT=1 python scripts/lean_cost.py POOLS TASKS [CAPACITY_SCALE]``.
"""

from __future__ import annotations

import os
import sys

import select_passes as sp  # run from scripts/ or with it on sys.path

from app.scheduling import framework, lean

REPEAT = int(os.environ.get("REPEAT", "0"))
LEAN = 0


def select(spec, snapshot, *, assumed=None, top_k=5):
    global LEAN
    if lean.covers(spec):
        LEAN += 1
        for _ in range(REPEAT):
            lean.decide(spec, snapshot, assumed=assumed, top_k=top_k)
    return framework.select_ranked(spec, snapshot, assumed=assumed, top_k=top_k)


if __name__ == "__main__":
    sp.select = select
    sp.main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
    print(f"lean tasks {LEAN} repeat {REPEAT}")
