"""Time the lean and the full select on the same tasks, alternating, in one process.

Usage: ``python scripts/lean_vs_full.py POOLS TASKS``: replays the e2e bench dataset (shard 0
of 2) and, for every task the lean path covers, calls ``select`` (lean) then ``select_full``
on the same overlay; prints the mean thread CPU of each. See docs/benchmarks.md, Core.
"""

from __future__ import annotations

import sys
import time

from app.bench.dataset import dataset_generate
from app.bench.replay import replay
from app.scheduling.framework import select, select_full
from app.scheduling.lean import covers

totals = {"lean": 0, "full": 0, "covered": 0, "other": 0}


def both(spec, snapshot, *, assumed, top_k):
    """Return the dispatching select's result, timing it and the full path's on lean specs."""
    if not covers(spec):
        totals["other"] += 1
        return select(spec, snapshot, assumed=assumed, top_k=top_k)
    t0 = time.thread_time_ns()
    result = select(spec, snapshot, assumed=assumed, top_k=top_k)
    t1 = time.thread_time_ns()
    select_full(spec, snapshot, assumed=assumed, top_k=top_k)
    totals["lean"] += t1 - t0
    totals["full"] += time.thread_time_ns() - t1
    totals["covered"] += 1
    return result


if __name__ == "__main__":
    ds = dataset_generate(pools=int(sys.argv[1]), tasks=int(sys.argv[2]))
    for _ in replay(ds, both, shard=(0, 2)):
        pass
    n = totals["covered"]
    print(f"lean {totals['lean'] / n / 1e3:.1f} us, full {totals['full'] / n / 1e3:.1f} us "
          f"over {n} lean tasks ({totals['other']} others)")
