"""Drain preview reads: the live leases of a pool with their tasks, and what those tasks hold
elsewhere.

A drain whose deadline passes revokes every live lease on the pool; each task loses all its
leases and reservations at once (a gang's members on other pools too, see
:mod:`app.ledger.recovery`) and goes back to the queue. These reads give the preview what it
needs to decide where those tasks would go now. They lock nothing and write nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from app.db import Connection
from app.scheduling.records import Vector

_LEASES = (
    "SELECT l.id, l.task_id, l.state, t.tenant_id, t.seq, t.priority, t.spec::text, "
    "t.admitted_at, t.attempts, t.max_attempts "
    "FROM leases l JOIN tasks t ON t.id = l.task_id "
    "WHERE l.pool_id = $1 AND l.state IN ('ACTIVE', 'REVOKING') "
    "ORDER BY t.seq, l.id"
)

# What the tasks hold on other pools and would give back to the ledger when revoked: not
# what a revoking lease hands over to its preemptor.
_RELEASED_ELSEWHERE = (
    "SELECT r.pool_id, SUM(r.cpu), SUM(r.memory), SUM(r.llm) FROM reservations r "
    "JOIN leases l ON l.task_id = r.task_id AND l.pool_id = r.pool_id "
    "AND l.state IN ('ACTIVE', 'REVOKING') "
    "WHERE r.task_id = ANY($1::uuid[]) AND r.pool_id <> $2 AND NOT r.hold "
    "AND l.preempted_by IS NULL "
    "GROUP BY r.pool_id"
)


# What the tasks' live leases use, per tenant and runtime class: the quota usage their
# revocation gives back (every lease end lowers its tenant's usage rows).
_USAGE_RETURNED = (
    "SELECT t.tenant_id, t.runtime_class, SUM(r.cpu), SUM(r.memory), SUM(r.llm) "
    "FROM reservations r JOIN tasks t ON t.id = r.task_id "
    "WHERE r.task_id = ANY($1::uuid[]) AND NOT r.hold GROUP BY 1, 2"
)


@dataclass(frozen=True, slots=True)
class LeaseMoving:
    """A live lease of the drained pool and the task it would send back to the queue."""

    lease_id: uuid.UUID
    task_id: uuid.UUID
    lease_state: str
    tenant_id: str
    seq: int
    priority: int
    spec_json: str
    admitted_at: datetime
    attempts: int
    max_attempts: int


async def drain_leases_read(conn: Connection, *, pool_id: str) -> list[LeaseMoving]:
    """Return the live leases of ``pool_id`` with their tasks, in admission order."""
    return [LeaseMoving(*row) for row in await conn.fetch(_LEASES, pool_id)]


async def drain_released_read(
    conn: Connection, *, task_ids: Collection[uuid.UUID], pool_id: str
) -> dict[str, Vector]:
    """Return, per other pool, what ``task_ids`` reserve there and would release if revoked."""
    if not task_ids:
        return {}
    rows = await conn.fetch(_RELEASED_ELSEWHERE, sorted(task_ids), pool_id)
    return {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in rows}


async def drain_usage_returned_read(
    conn: Connection, *, task_ids: Collection[uuid.UUID]
) -> dict[tuple[str, str], Vector]:
    """Return, per (tenant, runtime class), what the live leases of ``task_ids`` use: the
    quota usage revoking them would give back."""
    if not task_ids:
        return {}
    rows = await conn.fetch(_USAGE_RETURNED, sorted(task_ids))
    return {(r[0], r[1]): (int(r[2]), int(r[3]), int(r[4])) for r in rows}
