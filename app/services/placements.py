"""Placement preview: a dry run of the core on the live snapshot; it reads and writes nothing.

The preview makes the same snapshot read as a reconciler pass (pools, ledgers, heartbeat
freshness, the tenant's placed tasks for affinity, and the quota rows of the spec's runtime
class) and runs ``select(..., explain=True)`` with the pass's quota stage
(:class:`~app.scheduling.plugins.quota.QuotaBook`): a spec over its tenant's quota is refused
with ``quota_exceeded`` or ``quota_borrow_unavailable`` and the numbers. For a spec that may
preempt and fits nowhere (but within its quota), it also plans the preemption a pass would
make, with every candidate pool and the victims each would need. A task submitted right after may
still land elsewhere if the ledger moves.

The read (:func:`placement_inputs_read`, on the event loop) and the decision
(:func:`placement_decide`, pure, run in a worker by the API) are separate steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from app.auth import Principal
from app.db import Database
from app.ledger.preemption import victims_read
from app.ledger.quotas import QuotaRow, quota_rows_read
from app.ledger.snapshot import placements_read, pools_read
from app.scheduling.framework import select
from app.scheduling.plugins.quota import REASONS as QUOTA_REASONS
from app.scheduling.plugins.quota import QuotaBook
from app.scheduling.preemption import Preemption, Victim, VictimIndex, plan_preemption
from app.scheduling.results import Result
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import CompiledSpec, TaskSpec, compile_spec
from app.services.tenancy import tenant_acting

__all__ = ["PlacementInputs", "placement_decide", "placement_inputs_read"]


@dataclass(frozen=True, slots=True)
class PlacementInputs:
    """What a placement preview decides on: the compiled spec and the rows read for it."""

    spec: CompiledSpec
    pools: list[PoolState]
    placed: list[PlacedTask]
    strategy: str
    quota_rows: list[QuotaRow]
    cohorts: dict[str, str]
    victims: list[Victim]


async def placement_inputs_read(
    db: Database,
    *,
    principal: Principal,
    tenant: str | None,
    spec: TaskSpec,
    freshness_seconds: float,
    strategy: str,
) -> PlacementInputs:
    """Read what placing ``spec`` now depends on; decides nothing."""
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
    return PlacementInputs(compiled, pools, list(placed), strategy, rows, cohorts, victims)


def placement_decide(inputs: PlacementInputs) -> tuple[Result, Preemption | None]:
    """Return the explained result of placing the spec (every candidate and rejection) and,
    for a preemptor that fits nowhere, the preemption it would make; pure."""
    compiled = inputs.spec
    snapshot = Snapshot.build(inputs.pools, inputs.placed, strategy=inputs.strategy)
    book = QuotaBook(inputs.quota_rows, inputs.cohorts) if inputs.quota_rows else None
    result = select(compiled, snapshot, explain=True, quotas=book)
    preemption = None
    # A task over its quota displaces nothing (as in a pass): its own limit stops it.
    over_quota = result.reason is not None and result.reason.code in QUOTA_REASONS
    if result.placement is None and inputs.victims and not over_quota:
        preemption = plan_preemption(
            compiled, snapshot, VictimIndex(snapshot, inputs.victims), explain=True
        )
    return result, preemption

