"""One reconciler's select loop over the e2e bench dataset, runnable on this tree and on older
ones (before ``StoredSpecs`` and ``Assumed.add(task_id=)``, and before ``select_ranked``, the
reconciler's select since the lean placement became plain values), for instruction counts.

Usage: ``python scripts/select_passes.py POOLS TASKS [CAPACITY_SCALE]``; prints the thread CPU
per task. With ``SKIP=1`` in the environment it stops before the passes (subtract that run's
instructions from a full run's); with ``MIX=antiaffinity`` (or another ``--mix`` of `berth
bench e2e`) it replays that mix's dataset. With ``REPEAT=terms`` every single-member task with
affinity terms (``REPEAT=gang``: every gang) is selected twice, the first result dropped:
that run's instructions less a plain run's are what those tasks' selects cost (warm memo).
See docs/benchmarks.md, Core.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from dataclasses import replace

import orjson

from app.bench.dataset import dataset_generate
from app.scheduling import framework
from app.scheduling.assumed import Assumed
from app.scheduling.explain import placement_document
from app.scheduling.snapshot import PoolState, Snapshot
from app.scheduling.spec import TaskSpec, compile_spec
from app.scheduling.unsatisfiable import UnsatisfiableCache

NEW = "task_id" in inspect.signature(Assumed.add).parameters
#: The reconciler's select where the tree has it: lean placements as plain values.
RANKED = hasattr(framework, "select_ranked")
select = framework.select_ranked if RANKED else framework.select


def document(result) -> dict:
    """Return the stored placement document of a result, as the reconciler builds it."""
    if RANKED and result.__class__.__name__ == "Ranked":
        from app.scheduling.explain import ranked_document

        return ranked_document(result)
    placement = result.placement
    return placement_document(
        placement, members=placement.members, alternatives=placement.alternatives
    )


def states(ds, scale: float) -> list[PoolState]:
    totals = {row[0]: tuple(int(v * scale) for v in row[1:]) for row in ds.ledgers}
    return [
        PoolState(
            id=p[0], tenant_ids=frozenset(p[1]), runtime_class=p[2], runtime_instance_id=p[3],
            region=p[4], data_residency=p[5], failure_domain=p[6], labels=orjson.loads(p[7]),
            artifact_regions=frozenset(p[8]), cost_weight=float(p[9]), capacity=totals[p[0]],
        )
        for p in ds.pools
    ]


def compiler():
    if NEW:
        from app.scheduling.spec import StoredSpecs

        specs = StoredSpecs()
        return lambda task: specs.compile(task[2], task[6])
    cache: dict = {}

    def compile_old(task):
        key = (task[2], task[6])
        template = cache.get(key)
        if template is None:
            spec = TaskSpec.model_validate_json(task[6])
            template = cache[key] = compile_spec(spec, tenant_id=task[2])
        return replace(template, task_id=str(task[1]))

    return compile_old


REPEAT = os.environ.get("REPEAT")
repeated = [0]


def one_pass(snapshot: Snapshot, tasks: list, compile_task) -> Assumed:
    assumed = Assumed(snapshot)
    cache = UnsatisfiableCache(assumed)
    for task in tasks:
        spec = compile_task(task)
        if cache.get(spec) is not None:
            continue
        if REPEAT and (
            spec.is_gang if REPEAT == "gang" else (spec.required or spec.preferred)
            and not spec.is_gang
        ):
            repeated[0] += 1
            select(spec, snapshot, assumed=assumed, top_k=4)
        result = select(spec, snapshot, assumed=assumed, top_k=4)
        members = result.members if RANKED else (
            result.placement.members if result.placement is not None else None
        )
        if members is not None:
            if NEW:
                assumed.add(spec, members, task_id=str(task[1]))
            else:
                assumed.add(spec, members)
            document(result)
        elif result.reason is not None:
            cache.put(spec, result.reason)
    return assumed


def main(pools: int, tasks: int, scale: float = 1.0) -> None:
    mix = os.environ.get("MIX")
    ds = dataset_generate(pools=pools, tasks=tasks, **({"mix": mix} if mix else {}))
    snapshot = Snapshot.build(states(ds, scale))
    mine = [t for t in ds.tasks if t[3] % 2 == 0]
    if os.environ.get("SKIP"):
        mine = []
    compile_task = compiler()
    from app.scheduling import lean

    if hasattr(lean, "warm"):
        from app.scheduling import kernel

        kernel.load()  # the compiled kernel, built and loaded before the timed passes
    cpu = 0.0
    for start in range(0, len(mine), 1024):
        t0 = time.thread_time()
        assumed = one_pass(snapshot, mine[start:start + 1024], compile_task)
        cpu += time.thread_time() - t0
        snapshot = snapshot.with_usage(
            capacity=[tuple(c) for c in snapshot.cap.tolist()],
            reserved=[tuple(r) for r in (snapshot.reserved + assumed.usage).tolist()],
            fresh=snapshot.fresh.tolist(),
        )
    tree = "new" if NEW else "base"
    per_task = cpu * 1e6 / max(len(mine), 1)
    print(f"{tree} pools={pools} tasks={len(mine)} {per_task:.1f} us/task cpu"
          + (f" repeated={repeated[0]}" if REPEAT else ""))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
