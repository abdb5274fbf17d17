"""Placement preview: a dry run of the core on the live snapshot; it reads and writes nothing.

The preview makes the same snapshot read as a reconciler pass (pools, ledgers, heartbeat
freshness, the tenant's placed tasks for affinity, and the quota rows of the spec's runtime
class) and runs ``select(..., explain=True)`` with the pass's quota stage
(:class:`~app.scheduling.plugins.quota.QuotaBook`): a spec over its tenant's quota is refused
with ``quota_exceeded`` or ``quota_borrow_unavailable`` and the numbers. For a spec that may
preempt and fits nowhere (but within its quota), it also plans the preemption a pass would
make, with every candidate pool and the victims each would need. A task submitted right after may
still land elsewhere if the ledger moves.
"""

from __future__ import annotations

from datetime import UTC, datetime

from app.auth import Principal
from app.db import Database
from app.ledger.preemption import victims_read
from app.ledger.quotas import quota_rows_read
from app.ledger.snapshot import placements_read, pools_read
from app.scheduling.framework import select
from app.scheduling.plugins.quota import REASONS as QUOTA_REASONS
from app.scheduling.plugins.quota import QuotaBook
from app.scheduling.preemption import Preemption, VictimIndex, plan_preemption
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
) -> tuple[Result, Preemption | None]:
    """Return the explained result of placing ``spec`` now (every candidate and rejection)
    and, for a preemptor that fits nowhere, the preemption it would make."""
    tenant_id = tenant_acting(principal, tenant)
    compiled = compile_spec(spec, tenant_id=tenant_id)
    async with db.connection() as conn:
        # Every pool is read, as in a pass; the core shows the tenant only the pools listing it.
        pools = await pools_read(conn, now=datetime.now(UTC), freshness_seconds=freshness_seconds)
        placed = await placements_read(conn, tenant_ids=[tenant_id])
        rows, cohorts = await quota_rows_read(
            conn, runtime_classes=[compiled.runtime_class], tenant_ids=[tenant_id]
        )
        victims = (
            await victims_read(conn, below={tenant_id: compiled.priority})
            if compiled.may_preempt else []
        )
    snapshot = Snapshot.build(pools, placed, strategy=strategy)
    book = QuotaBook(rows, cohorts) if rows else None
    result = select(compiled, snapshot, explain=True, quotas=book)
    preemption = None
    # A task over its quota displaces nothing (as in a pass): its own limit stops it.
    over_quota = result.reason is not None and result.reason.code in QUOTA_REASONS
    if result.placement is None and victims and not over_quota:
        preemption = plan_preemption(
            compiled, snapshot, VictimIndex(snapshot, victims), explain=True
        )
    return result, preemption
