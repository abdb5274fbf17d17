"""The select calls of the tasks the lean select does not cover (affinity terms, gangs),
captured from a replay of the e2e bench dataset and replayed alone, for instruction counts.

Usage::

    python scripts/terms_cost.py capture POOLS TASKS MIX OUT   # MIX: default, antiaffinity
    python scripts/terms_cost.py run OUT WHAT [KIND]           # WHAT: none, select, full

``capture`` replays shard 0 of 2 (``app.bench.replay``: the next pass sees the previous ones'
placements) and pickles each pass's snapshot and its tasks' specs and placements; the
snapshots' memo entries that only tasks with terms build (affinity term counts) are dropped,
the others (the lean classes, the static filters) kept, as a pass has them. ``run`` rebuilds
each pass's overlay placement by placement and decides every task with affinity terms or a
gang, once, where the pass did, with the dispatching select (``select_ranked``, the
reconciler's) or ``select_full`` (``none``: only the overlay). Under callgrind, ``select``
less ``none`` over the calls is the instructions per such task (``KIND`` ``terms`` or ``gang``:
only the single-member tasks with terms, or only the gangs)::

    ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | grep Collected; }
    ir python3.11 scripts/terms_cost.py run OUT select   # minus
    ir python3.11 scripts/terms_cost.py run OUT none

The capture pickles this tree's classes; run it with the trees compared on the same file
(their snapshot, overlay and spec classes must agree).
"""

from __future__ import annotations

import gc
import pickle
import sys

from app.bench.dataset import dataset_generate
from app.bench.replay import replay
from app.scheduling import framework
from app.scheduling.assumed import Assumed

#: Memo kinds only the affinity terms build (older and newer trees' names).
_TERM_KINDS = frozenset({"dom", "domt"})


def capture(pools: int, tasks: int, mix: str, out: str) -> None:
    ds = dataset_generate(pools=pools, tasks=tasks, mix=mix)
    passes: dict[int, tuple] = {}

    def select(spec, snapshot, *, assumed, top_k):
        result = framework.select(spec, snapshot, assumed=assumed, top_k=top_k)
        steps = passes.setdefault(id(snapshot), (snapshot, []))[1]  # kept: ids stay unique
        terms = bool(spec.required or spec.preferred or spec.is_gang)
        steps.append((spec, f"t{len(steps)}", result.members, terms))
        return result

    for _ in replay(ds, select, batch=1024, top_k=4, shard=(0, 2)):
        pass
    for snapshot, _ in passes.values():
        memo = snapshot._memo
        for key in [k for k in memo if k[0] in _TERM_KINDS or (k[0] == "placed" and k[2])]:
            del memo[key]
    with open(out, "wb") as f:
        pickle.dump(list(passes.values()), f, protocol=pickle.HIGHEST_PROTOCOL)
    steps = [s for _, pass_steps in passes.values() for s in pass_steps if s[3]]
    gangs = sum(s[0].is_gang for s in steps)
    print(f"captured {len(passes)} passes, {len(steps)} calls ({gangs} gangs)")


def run(path: str, what: str, kind: str = "all") -> None:
    with open(path, "rb") as f:
        passes = pickle.load(f)
    # The loaded passes out of the collector's reach: its collections walk what the calls
    # make, not the capture (a reconciler's heap holds one pass).
    gc.freeze()
    select = framework.select_full if what == "full" else framework.select_ranked
    calls = 0
    for snapshot, steps in passes:
        assumed = Assumed(snapshot)
        for spec, task_id, members, terms in steps:
            if terms and what != "none" and (kind == "all" or (kind == "gang") == spec.is_gang):
                select(spec, snapshot, assumed=assumed, top_k=4)
                calls += 1
            if members is not None:
                assumed.add(spec, members, task_id=task_id)
    print(f"{what}: {calls} calls")


if __name__ == "__main__":
    if sys.argv[1] == "capture":
        capture(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        run(*sys.argv[2:])
