"""Replay the end-to-end benchmark's dataset through the core, in passes, without a database.

:func:`replay` does what one reconciler's passes do between the claim and the commit: it
builds the snapshot from the dataset's pools and ledgers, takes the tasks of its shard in
admission order ``batch`` at a time, compiles each spec, asks ``select`` (with the pass's
``Assumed`` overlay and unsatisfiable cache) and builds the stored placement document; the
next pass sees the previous ones' placements as reserved. ``berth bench core --dataset e2e``
times it; tests/scheduling/test_lean.py runs the lean and the full select side by side on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson

from app.bench.dataset import Dataset
from app.scheduling.assumed import Assumed
from app.scheduling.explain import placement_document
from app.scheduling.results import Result
from app.scheduling.snapshot import PoolState, Snapshot
from app.scheduling.spec import CompiledSpec, TaskSpec, compile_spec
from app.scheduling.unsatisfiable import UnsatisfiableCache

__all__ = ["Step", "dataset_snapshot", "replay"]

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
    compiled: dict[tuple[str, str], CompiledSpec] = {}
    for start in range(0, len(mine), batch):
        assumed = Assumed(snapshot)
        cache = UnsatisfiableCache(assumed)
        for task in mine[start:start + batch]:
            key = (task[2], task[6])
            template = compiled.get(key)
            if template is None:
                spec_model = TaskSpec.model_validate_json(task[6])
                template = compiled[key] = compile_spec(spec_model, tenant_id=task[2])
            t0 = time.thread_time_ns()
            spec = template  # shared by equal spec texts, as the reconciler's compile cache
            if cache.get(spec) is not None:
                yield Step(spec, None, time.thread_time_ns() - t0, cached=True)
                continue
            result = select(spec, snapshot, assumed=assumed, top_k=top_k)
            placement = result.placement
            if placement is not None:
                assumed.add(spec, placement.members, task_id=str(task[1]))
                placement_document(
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
        )
