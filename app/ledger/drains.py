"""Drain preview reads: the live leases of a pool with their tasks, and what those tasks hold
elsewhere.

A drain whose deadline passes revokes every live lease on the pool; each task loses all its
leases and reservations at once (a gang's members on other pools too, see
:mod:`app.ledger.recovery`) and goes back to the queue. These reads give the preview what it
needs to decide where those tasks would go now. They lock nothing and write nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import orjson

from app.db import Connection
from app.scheduling.records import Vector

# The live leases of pool $1 with their tasks, in admission order, as one JSON text, and the
# tenants among them: a preview reads them as two values, so the API process builds no object
# per lease (the worker that decides decodes the text, :func:`drain_leases_decode`).
_LEASES_PACKED = (
    "SELECT COALESCE(json_agg(json_build_array(l.id, l.task_id, l.state, t.tenant_id, t.seq, "
    "t.priority, t.spec::text, t.admitted_at, t.attempts, t.max_attempts) "
    "ORDER BY t.seq, l.id)::text, '[]'), COALESCE(array_agg(DISTINCT t.tenant_id), '{}') "
    "FROM leases l JOIN tasks t ON t.id = l.task_id "
    "WHERE l.pool_id = $1 AND l.state IN ('ACTIVE', 'REVOKING')"
)

# The tasks whose live lease is on pool $1: those a drain of it would send back.
_MOVING = "SELECT task_id FROM leases WHERE pool_id = $1 AND state IN ('ACTIVE', 'REVOKING')"

# What the tasks hold on other pools and would give back to the ledger when revoked: not
# what a revoking lease hands over to its preemptor.
_RELEASED_ELSEWHERE = (
    "SELECT r.pool_id, SUM(r.cpu), SUM(r.memory), SUM(r.llm) FROM reservations r "
    "JOIN leases l ON l.task_id = r.task_id AND l.pool_id = r.pool_id "
    "AND l.state IN ('ACTIVE', 'REVOKING') "
    f"WHERE r.task_id IN ({_MOVING}) AND r.pool_id <> $1 AND NOT r.hold "
    "AND l.preempted_by IS NULL "
    "GROUP BY r.pool_id"
)


# What the tasks' live leases use, per tenant and runtime class: the quota usage their
# revocation gives back (every lease end lowers its tenant's usage rows).
_USAGE_RETURNED = (
    "SELECT t.tenant_id, t.runtime_class, SUM(r.cpu), SUM(r.memory), SUM(r.llm) "
    "FROM reservations r JOIN tasks t ON t.id = r.task_id "
    f"WHERE r.task_id IN ({_MOVING}) AND NOT r.hold GROUP BY 1, 2"
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


async def drain_leases_packed_read(conn: Connection, *, pool_id: str) -> tuple[str, list[str]]:
    """Return the live leases of ``pool_id`` with their tasks as one JSON text (decoded by
    :func:`drain_leases_decode`) and the tenants of those leases."""
    packed, tenants = await conn.fetchrow(_LEASES_PACKED, pool_id)
    return packed, list(tenants)


def drain_leases_decode(packed: str) -> list[LeaseMoving]:
    """Return the leases of a :func:`drain_leases_packed_read` text, in admission order."""
    return [
        LeaseMoving(uuid.UUID(r[0]), uuid.UUID(r[1]), r[2], r[3], r[4], r[5], r[6],
                    datetime.fromisoformat(r[7]), r[8], r[9])
        for r in orjson.loads(packed)
    ]


async def drain_released_read(conn: Connection, *, pool_id: str) -> dict[str, Vector]:
    """Return, per other pool, what the tasks leased on ``pool_id`` reserve there and would
    release if revoked."""
    rows = await conn.fetch(_RELEASED_ELSEWHERE, pool_id)
    return {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in rows}


async def drain_usage_returned_read(
    conn: Connection, *, pool_id: str
) -> dict[tuple[str, str], Vector]:
    """Return, per (tenant, runtime class), what the live leases of the tasks leased on
    ``pool_id`` use: the quota usage revoking them would give back."""
    rows = await conn.fetch(_USAGE_RETURNED, pool_id)
    return {(r[0], r[1]): (int(r[2]), int(r[3]), int(r[4])) for r in rows}
