"""Leases: runtime heartbeats, a runtime's lease list, completion with fencing, cancel, revoke.

A lease is granted at placement (see :mod:`app.ledger.claims`) to the pool's runtime instance
with an expiry and a fencing ``epoch``. Heartbeats keep the instance healthy and push the
expiry of its live leases forward. Completing a lease names its epoch: a lease that was
recovered (expired, revoked) and re-granted has moved on, so a stale runtime is refused with
409. Completion and cancel release capacity in the same transaction that changes the task's
state. Lock order everywhere: task row, then lease rows, then ledger rows (sorted, last).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from app.db import Connection
from app.errors import Conflict, NotFound, Unprocessable
from app.ledger.events import task_events_add
from app.ledger.preemption import leases_end, reservations_hand_over
from app.ledger.reclaim import RECLAIMED, reclaimed_of
from app.ledger.recovery import (
    TASKS_REQUEUE,
    RecoveryCause,
    leases_requeue,
    pool_leased_tasks,
)
from app.ledger.tasks import TaskNotFound
from app.ledger.wakeups import WakeSource, wakeup_notify

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
#: Lease states a runtime may still complete (REVOKING: until its revoke deadline).
LIVE_STATES = frozenset({"ACTIVE", "REVOKING"})
OUTCOMES = {"succeeded": "SUCCEEDED", "failed": "FAILED", "released": "ADMITTED"}
#: Event reason (and lease end reason) of a lease the runtime gave back unfinished.
RELEASED = "lease_released"
DEFAULT_FRESHNESS_SECONDS = 15.0


class LeaseNotFound(NotFound):
    """The lease does not exist."""

    type_slug = "lease-not-found"


class LeaseStale(Conflict):
    """The lease is no longer live at this epoch: it expired, was revoked or was re-granted."""

    type_slug = "lease-stale"


class LeaseOutcomeInvalid(Unprocessable):
    """The outcome must be `succeeded`, `failed` or `released`."""


class TaskNotCancellable(Conflict):
    """The task already finished; only admitted or leased tasks can be cancelled."""

    type_slug = "task-not-cancellable"


#: How long a cancel waits for a reconciler pass that is scheduling the task (the pass holds
#: the task's row lock until it commits, usually well under this).
CANCEL_LOCK_TIMEOUT_MS = 1000
#: Retry-After of a cancel that found the task still being scheduled.
CANCEL_RETRY_AFTER_SECONDS = 1


class TaskBeingScheduled(Conflict):
    """A reconciler pass is placing the task right now; retry the cancel in a moment."""

    type_slug = "task-being-scheduled"


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """What a heartbeat did: leases renewed, whether the instance just became healthy, and
    the instance's revoking leases (the runtime should stop them by their ``revokeBy``)."""

    renewed_leases: int
    became_healthy: bool
    revoking: tuple[dict[str, Any], ...] = ()


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


_INSTANCE_LOCK = "SELECT last_heartbeat_at FROM runtime_instances WHERE id = $1 FOR UPDATE"
_INSTANCE_UPSERT = (
    "INSERT INTO runtime_instances (id, last_heartbeat_at, first_seen_at) "
    "VALUES ($1, $2, $2) ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = "
    "GREATEST(runtime_instances.last_heartbeat_at, EXCLUDED.last_heartbeat_at)"
)
_LEASES_RENEW = (
    "UPDATE leases SET expires_at = GREATEST(expires_at, $2) "
    "WHERE runtime_instance_id = $1 AND state = 'ACTIVE' AND expires_at > $3"
)
_POOL_NAMES_INSTANCE = "SELECT EXISTS (SELECT 1 FROM pools WHERE runtime_instance_id = $1)"
_REVOKING_OF_INSTANCE = (
    "SELECT id, task_id, epoch, revoke_by FROM leases "
    "WHERE runtime_instance_id = $1 AND state = 'REVOKING' ORDER BY revoke_by, id"
)


def _rowcount(status: str) -> int:
    """Return the row count of a command status such as ``UPDATE 3``."""
    return int(status.rsplit(" ", 1)[-1])


async def runtime_heartbeat(
    conn: Connection,
    *,
    instance_id: str,
    now: datetime,
    lease_ttl_seconds: float,
    freshness_seconds: float = DEFAULT_FRESHNESS_SECONDS,
) -> HeartbeatResult:
    """Record a heartbeat of ``instance_id`` and extend the expiry of its live leases.

    Leases already past their expiry are not revived: recovery owns them. When the instance
    was never seen or had gone stale and some pool names it, reconcilers are woken
    (``pool_healthy``) so that tasks pending for health are retried. Runs in the caller's
    transaction.
    """
    previous = await conn.fetchval(_INSTANCE_LOCK, instance_id)
    await conn.execute(_INSTANCE_UPSERT, instance_id, now)
    expires = now + timedelta(seconds=lease_ttl_seconds)
    renewed = _rowcount(await conn.execute(_LEASES_RENEW, instance_id, expires, now))
    stale = previous is None or previous <= now - timedelta(seconds=freshness_seconds)
    became_healthy = False
    if stale and await conn.fetchval(_POOL_NAMES_INSTANCE, instance_id):
        became_healthy = True
        await wakeup_notify(conn, source=WakeSource.POOL_HEALTHY, instances=[instance_id])
    revoking = tuple(
        {"leaseId": str(r[0]), "taskId": str(r[1]), "epoch": int(r[2]), "revokeBy": r[3]}
        for r in await conn.fetch(_REVOKING_OF_INSTANCE, instance_id)
    )
    return HeartbeatResult(
        renewed_leases=renewed, became_healthy=became_healthy, revoking=revoking
    )


_LEASES_OF_INSTANCE = (
    "SELECT l.id, l.task_id, l.pool_id, l.runtime_instance_id, l.epoch, l.expires_at, "
    "l.granted_at, COALESCE(r.members, 1), t.tenant_id, t.spec -> 'requests', t.labels, "
    "l.state, l.revoke_by "
    "FROM leases l JOIN tasks t ON t.id = l.task_id "
    "LEFT JOIN reservations r ON r.task_id = l.task_id AND r.pool_id = l.pool_id "
    "WHERE l.runtime_instance_id = $1 AND l.state IN ('ACTIVE', 'REVOKING') "
    "ORDER BY l.granted_at, l.id"
)


def _requests(raw: Any) -> dict[str, int]:
    raw = raw or {}
    return {
        "cpuMillis": int(raw.get("cpuMillis", 0)),
        "memoryMiB": int(raw.get("memoryMiB", 0)),
        "llmSlots": int(raw.get("llmSlots", 0)),
    }


async def runtime_leases_list(conn: Connection, *, instance_id: str) -> list[dict[str, Any]]:
    """Return the live leases granted to ``instance_id`` as camelCase dicts, oldest first.

    ``members`` is how many members of the task run on this lease's pool and ``requests``
    what each member needs. ``state`` is ``ACTIVE``, or ``REVOKING`` when the runtime should
    stop the work by ``revokeBy`` (a completion until then is honoured).
    """
    rows = await conn.fetch(_LEASES_OF_INSTANCE, instance_id)
    return [
        {
            "id": str(r[0]),
            "taskId": str(r[1]),
            "poolId": r[2],
            "runtimeInstanceId": r[3],
            "epoch": int(r[4]),
            "expiresAt": _iso(r[5]),
            "grantedAt": _iso(r[6]),
            "members": int(r[7]),
            "tenantId": r[8],
            "requests": _requests(r[9]),
            "labels": dict(r[10] or {}),
            "state": r[11],
            "revokeBy": _iso(r[12]),
        }
        for r in rows
    ]


_LEASE_GET = "SELECT task_id, runtime_instance_id, state, epoch FROM leases WHERE id = $1"
_TASK_LOCK = "SELECT state FROM tasks WHERE id = $1 FOR UPDATE"
_TASK_FINISH = (
    "UPDATE tasks SET state = $2, finished_at = $3, updated_at = $3, "
    "failure_reason = $4, parked = false WHERE id = $1"
)


async def lease_check_owner(
    conn: Connection, *, lease_id: uuid.UUID, instance_ids: frozenset[str]
) -> None:
    """Raise LeaseNotFound unless the lease exists and belongs to one of ``instance_ids``."""
    lease = await conn.fetchrow(_LEASE_GET, lease_id)
    if lease is None or lease[1] not in instance_ids:
        raise LeaseNotFound(f"lease {lease_id} does not exist")


# A task whose revoking lease it gave back: queued again without using an attempt
# (``preemptions + 1`` keeps the next epoch higher, so a late report of the old one is 409).
_TASK_RETURN = (
    "UPDATE tasks SET state = 'ADMITTED', preemptions = preemptions + 1, parked = false, "
    "pending_reason = NULL, placement = NULL, leased_at = NULL, updated_at = $2 "
    "WHERE id = $1 RETURNING state, attempts"
)


async def _task_give_back(
    conn: Connection,
    *,
    task_id: uuid.UUID,
    revoking: bool,
    detail: dict[str, Any],
    heir: uuid.UUID | None,
    now: datetime,
) -> str:
    """Queue the task of a released lease again and write its event; return its new state.

    A revoking lease (the runtime was asked to stop) costs no attempt. An active one (the
    runtime gave the work back on its own, e.g. when shutting down) costs one, as an expiry
    does, and the task fails with ``lease_released`` once its attempts are used up.
    """
    reason = RELEASED
    if revoking:
        state, attempts = await conn.fetchrow(_TASK_RETURN, task_id, now)
        if heir is not None:
            detail["preemptorId"] = str(heir)
            # Given back to another tenant's task: a reclaim (app.ledger.reclaim).
            if await reclaimed_of(conn, heirs={task_id: heir}):
                reason = RECLAIMED
    else:
        _, state, attempts = await conn.fetchrow(TASKS_REQUEUE, [task_id], RELEASED, now)
    detail["attempts"] = int(attempts)
    await task_events_add(
        conn,
        rows=[{"task_id": task_id, "from_state": "LEASED", "to_state": state,
               "reason": reason, "detail": detail}],
        now=now,
    )
    return str(state)


async def lease_complete(
    conn: Connection,
    *,
    lease_id: uuid.UUID,
    epoch: int,
    outcome: str,
    message: str | None,
    now: datetime,
    instance_ids: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Finish the lease's task with ``outcome`` and release its capacity, checking the epoch.

    Raises LeaseNotFound when the lease does not exist or belongs to none of
    ``instance_ids`` (when given), LeaseStale when it is no longer live or ``epoch`` is not
    its epoch. Every live lease of the task (all of a gang's pools) ends with it. Runs in the
    caller's transaction.
    """
    state = OUTCOMES.get(outcome)
    if state is None:
        raise LeaseOutcomeInvalid(
            f"outcome must be 'succeeded', 'failed' or 'released', not {outcome!r}"
        )
    lease = await conn.fetchrow(_LEASE_GET, lease_id)
    if lease is None or (instance_ids is not None and lease[1] not in instance_ids):
        raise LeaseNotFound(f"lease {lease_id} does not exist")
    task_id = lease[0]
    await conn.execute(_TASK_LOCK, task_id)
    # Re-read under the task lock: recovery or a cancel may have ended it meanwhile.
    _, _, lease_state, lease_epoch = await conn.fetchrow(_LEASE_GET, lease_id)
    if lease_state not in LIVE_STATES:
        raise LeaseStale(f"lease {lease_id} is {lease_state.lower()}, not active")
    if int(epoch) != int(lease_epoch):
        raise LeaseStale(
            f"stale epoch {epoch}: lease {lease_id} is at epoch {lease_epoch}",
            extra={"epoch": int(lease_epoch)},
        )
    detail: dict[str, Any] = {"leaseId": str(lease_id), "epoch": int(lease_epoch)}
    if message:
        detail["message"] = message[:1000]
    if outcome == "released":
        heirs = await leases_end(
            conn, task_ids=[task_id], state="COMPLETED", reason=RELEASED, now=now
        )
        state = await _task_give_back(
            conn, task_id=task_id, revoking=lease_state == "REVOKING", detail=detail,
            heir=heirs.get(task_id), now=now,
        )
    else:
        heirs = await leases_end(
            conn, task_ids=[task_id], state="COMPLETED", reason=outcome, now=now
        )
        failure = None if state == "SUCCEEDED" else "runtime_reported_failure"
        await conn.execute(_TASK_FINISH, task_id, state, now, failure)
        if task_id in heirs:
            # Finished within its grace period: honoured, its capacity goes to the preemptor.
            detail["preemptorId"] = str(heirs[task_id])
        await task_events_add(
            conn,
            rows=[{"task_id": task_id, "from_state": "LEASED", "to_state": state,
                   "reason": f"lease_{outcome}", "detail": detail}],
            now=now,
        )
    released = await reservations_hand_over(conn, task_ids=[task_id], heirs=heirs, now=now)
    if released:
        await wakeup_notify(conn, source=WakeSource.CAPACITY_RELEASED, pools=released)
    elif outcome == "released":
        await wakeup_notify(conn, source=WakeSource.SUBMITTED)
    return {
        "revoking": lease_state == "REVOKING",
        "taskId": str(task_id),
        "leaseId": str(lease_id),
        "state": state,
        "outcome": outcome,
        "epoch": int(lease_epoch),
        "finishedAt": now.isoformat(),
    }


_TASK_OF_TENANT_LOCK = "SELECT state FROM tasks WHERE id = $1 AND tenant_id = $2 FOR UPDATE"
_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', $1, true)"
_LOCK_TIMEOUT_RESET = "SET LOCAL lock_timeout TO DEFAULT"


async def _task_lock_briefly(conn: Connection, *, task_id: uuid.UUID, tenant_id: str) -> str:
    """Lock the tenant's task and return its state, waiting at most
    ``CANCEL_LOCK_TIMEOUT_MS`` for a pass that holds it (TaskBeingScheduled)."""
    await conn.execute(_LOCK_TIMEOUT, f"{CANCEL_LOCK_TIMEOUT_MS}ms")
    try:
        state = await conn.fetchval(_TASK_OF_TENANT_LOCK, task_id, tenant_id)
    except asyncpg.LockNotAvailableError:
        raise TaskBeingScheduled(
            f"task {task_id} is being placed by a reconciler right now; retry the cancel",
            extra={"headers": {"Retry-After": str(CANCEL_RETRY_AFTER_SECONDS)}},
        ) from None
    # The rest of the transaction waits for locks as usual (ledger rows are held briefly).
    await conn.execute(_LOCK_TIMEOUT_RESET)
    if state is None:
        raise TaskNotFound(f"task {task_id} does not exist")
    return state


async def task_cancel(
    conn: Connection, *, task_id: uuid.UUID, tenant_id: str, now: datetime
) -> str:
    """Cancel the tenant's task, ending its leases and releasing its capacity; return its state.

    A task a reconciler pass is scheduling is row-locked by that pass until it commits: the
    cancel waits for it (then cancels the task placed or parked), for at most
    ``CANCEL_LOCK_TIMEOUT_MS``, then raises TaskBeingScheduled (409, Retry-After). Runs in
    the caller's transaction.
    """
    state = await _task_lock_briefly(conn, task_id=task_id, tenant_id=tenant_id)
    if state in TERMINAL_STATES:
        raise TaskNotCancellable(f"task {task_id} is {state}; it can no longer be cancelled")
    heirs = {}
    if state == "LEASED":
        heirs = await leases_end(
            conn, task_ids=[task_id], state="CANCELLED", reason="task_cancelled", now=now
        )
    await conn.execute(_TASK_FINISH, task_id, "CANCELLED", now, None)
    await task_events_add(
        conn,
        rows=[{"task_id": task_id, "from_state": state, "to_state": "CANCELLED",
               "reason": "cancelled_by_tenant"}],
        now=now,
    )
    # A cancelled preemptor's holds are released; a cancelled victim's capacity is handed over.
    released = await reservations_hand_over(conn, task_ids=[task_id], heirs=heirs, now=now)
    if released:
        await wakeup_notify(conn, source=WakeSource.CAPACITY_RELEASED, pools=released)
    return "CANCELLED"


async def pool_leases_revoke(conn: Connection, *, pool_id: str, now: datetime) -> int:
    """Revoke every live lease on ``pool_id`` and requeue (or fail) its tasks; return how many."""
    task_ids = await pool_leased_tasks(conn, pool_id=pool_id)
    result = await leases_requeue(
        conn, task_ids=task_ids, now=now, cause=RecoveryCause.REVOKED
    )
    return result.tasks
