"""Placement preview: a dry run of the core on the live snapshot; it reads and writes nothing.

The preview makes the same snapshot read as a reconciler pass (pools, ledgers, heartbeat
freshness, and the tenant's placed tasks for affinity) and runs ``select(..., explain=True)``.
A task submitted right after may still land elsewhere if the ledger moves.
"""

from __future__ import annotations

from datetime import UTC, datetime

from app.auth import Principal
from app.db import Database
from app.ledger.snapshot import placements_read, pools_read
from app.scheduling.framework import select
from app.scheduling.results import Result
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import TaskSpec, compile_spec
from app.services.tenancy import tenant_acting

__all__ = ["placement_preview"]


async def placement_preview(
    db: Database,
    *,
    principal: Principal,
    tenant: str | None,
    spec: TaskSpec,
    freshness_seconds: float,
    strategy: str,
) -> Result:
    """Return the explained result of placing ``spec`` now: every candidate and rejection."""
    tenant_id = tenant_acting(principal, tenant)
    async with db.connection() as conn:
        # Every pool is read, as in a pass; the core shows the tenant only the pools listing it.
        pools = await pools_read(conn, now=datetime.now(UTC), freshness_seconds=freshness_seconds)
        placed = await placements_read(conn, tenant_ids=[tenant_id])
    snapshot = Snapshot.build(pools, placed, strategy=strategy)
    return select(compile_spec(spec, tenant_id=tenant_id), snapshot, explain=True)
