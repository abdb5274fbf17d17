"""Small builders of pools, specs and snapshots for the core's tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import CompiledSpec, TaskSpec, compile_spec

TENANT = "acme"


def pool(pid: str, **kw: Any) -> PoolState:
    """Return a healthy ACTIVE pool of runtime class ``py`` open to ``acme`` (overridable)."""
    fields: dict[str, Any] = {
        "id": pid,
        "tenant_ids": frozenset({TENANT}),
        "runtime_class": "py",
        "runtime_instance_id": f"rt-{pid}",
        "region": "r1",
        "data_residency": "eu",
        "failure_domain": "fd1",
        "labels": {},
        "capacity": (4000, 8192, 4),
        "reserved": (0, 0, 0),
    }
    fields.update(kw)
    if isinstance(fields["tenant_ids"], (set, list, tuple)):
        fields["tenant_ids"] = frozenset(fields["tenant_ids"])
    return PoolState(**fields)


def spec(*, tenant: str = TENANT, task_id: str | None = "t", **body: Any) -> CompiledSpec:
    """Return a compiled spec; ``body`` holds camelCase fields over a 1-cpu ``py`` default."""
    data: dict[str, Any] = {"runtimeClass": "py", "requests": {"cpuMillis": 1000}}
    data.update(body)
    return compile_spec(TaskSpec.model_validate(data), tenant_id=tenant, task_id=task_id)


def snapshot(pools: list[PoolState], placed: list[PlacedTask] = (), **kw: Any) -> Snapshot:
    """Return a snapshot of ``pools`` and ``placed``."""
    return Snapshot.build(pools, placed, **kw)


def placed(task_id: str, pool_id: str, tenant: str = TENANT, **labels: str) -> PlacedTask:
    """Return a leased task of ``tenant`` with ``labels`` on ``pool_id``."""
    return PlacedTask(task_id, tenant, labels, (pool_id,))


def placed_counts(snapshot: Snapshot, tenant_id: str, selector: frozenset | None) -> np.ndarray:
    """Return, per pool of ``snapshot``, how many actual member placements of the tenant match
    ``selector`` (None: every placement of the tenant)."""
    idx, members = snapshot.placed_members(tenant_id, selector)
    return np.bincount(idx, weights=members, minlength=snapshot.n).astype(np.int64, copy=False)
