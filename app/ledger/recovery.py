"""Lease recovery: expired or revoked leases send their tasks back to the queue (or fail them).

A task whose lease lapsed (its runtime stopped heartbeating) or was revoked (its pool's drain
deadline passed) loses every live lease and reservation in one transaction, its capacity
returns to the ledger, and it goes back to ``ADMITTED`` with ``attempts + 1`` — or to
``FAILED`` once ``attempts`` reaches ``max_attempts``. Task rows are locked first (sorted by
id, skipping rows a completion or cancel holds right now: that writer wins), the ledger is
changed last. Only the reconciler holding the leadership lock calls
:func:`leases_expired_recover` and :func:`pools_drain_overdue`; the statements are safe under
concurrency anyway because every row is re-checked after locking.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from app.db import Connection
from app.ledger.events import task_events_add
from app.ledger.preemption import leases_end, reservations_hand_over
from app.ledger.wakeups import WakeSource, wakeup_notify


class RecoveryCause(StrEnum):
    """Why leases are taken back; the values label the expired-leases metric."""

    EXPIRED = "expired"
    REVOKED = "revoked"


#: Per cause: the lease state, the event reason and the task failure reason.
_CAUSES = {
    RecoveryCause.EXPIRED: ("EXPIRED", "lease_expired"),
    RecoveryCause.REVOKED: ("REVOKED", "lease_revoked"),
}


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What one recovery did: tasks requeued, tasks failed, and the pools capacity returned to."""

    requeued: int = 0
    failed: int = 0
    pools: frozenset[str] = frozenset()

    @property
    def tasks(self) -> int:
        """Return the number of tasks whose leases were recovered."""
        return self.requeued + self.failed


# ``(state = 'LEASED') IS TRUE``, not ``state = 'LEASED'``: that clause is the predicate of
# ``ix_tasks_leased_tenant``, which the planner would read whole (every leased task) and
# filter by id when the statistics predate the leases (see ``_UNLEASE`` in app.ledger.claims).
_TASKS_LOCK = (
    "SELECT id FROM tasks WHERE id = ANY($1::uuid[]) AND (state = 'LEASED') IS TRUE "
    "ORDER BY id FOR UPDATE SKIP LOCKED"
)
#: Requeue leased tasks with ``attempts + 1``, failing those that used their last attempt
#: ($2: the failure reason).
TASKS_REQUEUE = (
    "UPDATE tasks SET attempts = attempts + 1, "
    "state = CASE WHEN attempts + 1 >= max_attempts THEN 'FAILED' ELSE 'ADMITTED' END, "
    "failure_reason = CASE WHEN attempts + 1 >= max_attempts THEN $2::text END, "
    "finished_at = CASE WHEN attempts + 1 >= max_attempts THEN $3::timestamptz END, "
    "parked = false, pending_reason = NULL, placement = NULL, leased_at = NULL, "
    "updated_at = $3 "
    "WHERE id = ANY($1::uuid[]) RETURNING id, state, attempts"
)
# The expired leases, oldest first. No index holds the leases by expiry alone:
# ``ix_leases_instance_expiry`` (live leases by runtime instance, then expiry) is read whole,
# its second column tested on each entry, so the read grows with the live leases, never with
# ended ones (the history).
_EXPIRED = (
    "SELECT DISTINCT task_id FROM ("
    "SELECT task_id FROM leases WHERE state IN ('ACTIVE', 'REVOKING') "
    "AND expires_at <= $1 AND state = 'ACTIVE' ORDER BY expires_at LIMIT $2) e"
)
_POOL_LEASED = (
    "SELECT DISTINCT task_id FROM leases WHERE state IN ('ACTIVE', 'REVOKING') AND pool_id = $1"
)
_DRAIN_OVERDUE = (
    "SELECT p.id FROM pools p WHERE p.status = 'DRAINING' AND p.drain_deadline <= $1 "
    "AND EXISTS (SELECT 1 FROM leases l WHERE l.pool_id = p.id "
    "AND l.state IN ('ACTIVE', 'REVOKING')) "
    "ORDER BY p.id"
)


async def leases_requeue(
    conn: Connection,
    *,
    task_ids: Iterable[uuid.UUID],
    now: datetime,
    cause: RecoveryCause,
) -> RecoveryResult:
    """End the live leases of the still-leased ``task_ids``, release them, requeue or fail them.

    Runs in the caller's transaction.
    """
    ids = sorted(set(task_ids))
    if not ids:
        return RecoveryResult()
    locked = [r[0] for r in await conn.fetch(_TASKS_LOCK, ids)]
    if not locked:
        return RecoveryResult()
    lease_state, reason = _CAUSES[cause]
    heirs = await leases_end(conn, task_ids=locked, state=lease_state, reason=reason, now=now)
    rows = await conn.fetch(TASKS_REQUEUE, locked, reason, now)
    await task_events_add(
        conn,
        rows=[
            {
                "task_id": r[0],
                "from_state": "LEASED",
                "to_state": r[1],
                "reason": reason,
                "detail": {"attempts": r[2]},
            }
            for r in rows
        ],
        now=now,
    )
    # A revoking victim's capacity goes to its preemptor, the rest back to the ledger.
    released = await reservations_hand_over(conn, task_ids=locked, heirs=heirs, now=now)
    if released:
        await wakeup_notify(conn, source=WakeSource.CAPACITY_RELEASED, pools=released)
    failed = sum(1 for r in rows if r[1] == "FAILED")
    return RecoveryResult(len(rows) - failed, failed, frozenset(released))


async def leases_expired_recover(
    conn: Connection, *, now: datetime, limit: int = 500
) -> RecoveryResult:
    """Recover up to ``limit`` leases that expired at or before ``now``."""
    ids = [r[0] for r in await conn.fetch(_EXPIRED, now, limit)]
    return await leases_requeue(conn, task_ids=ids, now=now, cause=RecoveryCause.EXPIRED)


async def pools_drain_overdue(conn: Connection, *, now: datetime) -> list[str]:
    """Return the draining pools whose deadline passed and that still hold live leases."""
    return [r[0] for r in await conn.fetch(_DRAIN_OVERDUE, now)]


async def pool_leased_tasks(conn: Connection, *, pool_id: str) -> list[uuid.UUID]:
    """Return the tasks holding a live lease on ``pool_id``."""
    return [r[0] for r in await conn.fetch(_POOL_LEASED, pool_id)]
