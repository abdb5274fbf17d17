"""Replay the end-to-end benchmark's dataset through the core, in passes, without a database.

:func:`replay` does what one reconciler's passes do between the claim and the commit: it
builds the snapshot from the dataset's pools and ledgers, takes the tasks of its shard in
admission order ``batch`` at a time, compiles each spec, asks ``select`` (with the pass's
``Assumed`` overlay and unsatisfiable cache) and builds the stored placement document; the
next pass sees the previous ones' placements as reserved and as placed tasks (which affinity
terms match). Each step's time is the thread's CPU time from the compile to the document.
``berth bench core --dataset e2e`` times it; tests/scheduling/test_lean.py runs the lean and
the full select side by side on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson

from app.bench.dataset import Dataset
from app.scheduling.assumed import Assumed
from app.scheduling.explain import placement_stored
from app.scheduling.results import Result
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import CompiledSpec, StoredSpecs
from app.scheduling.unsatisfiable import UnsatisfiableCache

__all__ = ["Step", "dataset_snapshot", "replay", "with_anti_affinity"]

Select = Callable[..., Result]


@dataclass(slots=True)
class Step:
    """One task's turn in a replayed pass: its spec, the result and the select time (ns)."""

    spec: CompiledSpec
    result: Result | None
    elapsed_ns: int
    #: True when the pass's unsatisfiable cache answered (``result`` is None then).
    cached: bool = False


def dataset_snapshot(
    ds: Dataset, *, capacity_scale: float = 1.0, strategy: str = "spread"
) -> Snapshot:
    """Return the snapshot of the dataset's pools and ledgers, nothing reserved yet;
    ``capacity_scale`` shrinks (or grows) every ledger total."""
    totals = {row[0]: tuple(int(v * capacity_scale) for v in row[1:]) for row in ds.ledgers}
    pools = [
        PoolState(
            id=p[0], tenant_ids=frozenset(p[1]), runtime_class=p[2], runtime_instance_id=p[3],
            region=p[4], data_residency=p[5], failure_domain=p[6], labels=orjson.loads(p[7]),
            artifact_regions=frozenset(p[8]), cost_weight=float(p[9]), capacity=totals[p[0]],
        )
        for p in ds.pools
    ]
    return Snapshot.build(pools, strategy=strategy)


def with_anti_affinity(ds: Dataset, fraction: float) -> Dataset:
    """Return ``ds`` with every ``1 / fraction``-th task given its tenant's ``app`` label and a
    required anti-affinity to it, by pool and by failure domain in turn."""
    if fraction <= 0:
        return ds
    step = max(1, round(1 / fraction))
    tasks = []
    for k, row in enumerate(ds.tasks):
        if k % step == 0:
            spec = orjson.loads(row[6])
            app = f"app-{row[2]}-{k // step % 4}"
            topology = "pool" if k // step % 2 == 0 else "failureDomain"
            spec["labels"] = {"app": app}
            spec["affinity"] = {"preferred": [], "required": [
                {"anti": True, "selector": {"app": app}, "topology": topology, "weight": None}]}
            text = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode()
            row = (*row[:6], text, orjson.dumps(spec["labels"]).decode(), *row[8:])
        tasks.append(row)
    return Dataset(ds.pools, ds.ledgers, ds.runtimes, tasks, ds.tenants, dict(ds.kinds))


def replay(
    ds: Dataset,
    select: Select,
    *,
    batch: int = 1024,
    top_k: int = 4,
    shard: tuple[int, int] = (0, 1),
    capacity_scale: float = 1.0,
    strategy: str = "spread",
) -> Iterator[Step]:
    """Yield every task of ``shard`` (index, count; by tenant shard) as a pass would decide
    it with ``select``, ``batch`` tasks per pass; placements are assumed, then reserved for
    the next pass."""
    snapshot = dataset_snapshot(ds, capacity_scale=capacity_scale, strategy=strategy)
    index, count = shard
    mine = [t for t in ds.tasks if t[3] % count == index]
    specs = StoredSpecs()
    placed: list[PlacedTask] = []
    for start in range(0, len(mine), batch):
        assumed = Assumed(snapshot)
        cache = UnsatisfiableCache(assumed)
        for task in mine[start:start + batch]:
            t0 = time.thread_time_ns()
            spec = specs.compile(task[2], task[6])
            if cache.get(spec) is not None:
                yield Step(spec, None, time.thread_time_ns() - t0, cached=True)
                continue
            result = select(spec, snapshot, assumed=assumed, top_k=top_k)
            placement = result.placement
            if placement is not None:
                assumed.add(spec, placement.members, task_id=str(task[1]))
                placed.append(PlacedTask(str(task[1]), task[2], dict(spec.labels),
                                         tuple(p for p, _ in placement.members)))
                placement_stored(
                    placement, members=placement.members, alternatives=placement.alternatives
                )
            elif result.reason is not None:
                cache.put(spec, result.reason)
            yield Step(spec, result, time.thread_time_ns() - t0)
        reserved = snapshot.reserved + assumed.usage
        snapshot = snapshot.with_usage(
            capacity=[tuple(c) for c in snapshot.cap.tolist()],
            reserved=[tuple(r) for r in reserved.tolist()],
            fresh=snapshot.fresh.tolist(),
            placed=placed,
        )
