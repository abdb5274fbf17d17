"""Task SQL for the API: submit (idempotent), get, list and the event history.

Submission is one statement: a CTE inserts the task and appends its ``ADMITTED`` event. On
an autocommit connection that statement is its own transaction. It sends no NOTIFY: a
transaction that notifies holds PostgreSQL's one notification lock through its commit (and
its WAL flush), so notifying submits commit one at a time; the service wakes reconcilers
after the commit instead, coalesced (:mod:`app.services.wakeups`). The idempotency race is settled
by the unique index on (tenant, idempotency key): the insert does nothing on a conflict and
the caller re-reads the winner.

The per-tenant cap on queued tasks (``BERTH_MAX_QUEUED_TASKS_PER_TENANT``) is checked inside
that same statement, without scanning the queue: ``tenant_queue_counts`` holds each tenant's
queued (ADMITTED) tasks in at most 16 stripes, kept exact by statement triggers on
``tasks`` (revision 0005), and the insert happens only while their sum is below the cap. The
sum is read from the statement's snapshot, so submissions of one tenant that run at the same
moment do not see each other: the cap can be exceeded by at most the number of that tenant's
submissions in flight at once (each holds a database connection, so at most the API's
connection pools together). Every read is tenant-scoped: a task of another tenant is
indistinguishable from a task that does not exist.

Rows come back as :class:`TaskRow` (plain values, JSON columns already decoded by the
connection's codecs); the API turns them into its task shape.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson

from app.db import Connection
from app.errors import BerthError, NotFound, Unprocessable
from app.ledger.idempotency import IdempotencyKeyReused
from app.shards import shard_of

__all__ = [
    "LeaseView",
    "QUEUE_FULL_RETRY_AFTER_SECONDS",
    "SpecHasNul",
    "TaskEventRow",
    "TaskNotFound",
    "TaskRow",
    "TenantQueueFull",
    "task_events_list",
    "task_get",
    "task_list",
    "task_submit",
    "uuid7",
    "uuid7_prefix",
]


_MS_MASK = (1 << 48) - 1
_RAND_B_MASK = (1 << 62) - 1
#: The version (7) and variant (0b10) bits of a UUIDv7.
_UUID7_BITS = (0x7 << 76) | (0b10 << 62)


def uuid7(now: datetime) -> uuid.UUID:
    """Return a UUIDv7 (RFC 9562) of ``now``: its millisecond since the epoch, then 74 random
    bits. Task ids grow with time, so new tasks append to ``pk_tasks`` and
    ``pk_task_events (task_id, id)`` instead of dirtying a random page of each."""
    rand = int.from_bytes(os.urandom(10))
    return uuid.UUID(int=((int(now.timestamp() * 1000) & _MS_MASK) << 80) | _UUID7_BITS
                     | ((rand >> 62) & 0xFFF) << 64 | (rand & _RAND_B_MASK))


def uuid7_prefix(now: datetime) -> str:
    """Return the first 14 characters of the text of a UUIDv7 of ``now`` ('tttttttt-tttt-',
    its millisecond): a batch's ids append the version digit and the rest in SQL."""
    ms = f"{int(now.timestamp() * 1000) & _MS_MASK:012x}"
    return f"{ms[:8]}-{ms[8:]}-"


class TaskNotFound(NotFound):
    """The task does not exist (or belongs to another tenant)."""

    type_slug = "task-not-found"


#: Retry-After of a submission refused by the per-tenant cap: queues drain at the pace of
#: placements, so an immediate retry would only be refused again.
QUEUE_FULL_RETRY_AFTER_SECONDS = 10


class TenantQueueFull(BerthError):
    """The tenant has as many queued tasks as BERTH_MAX_QUEUED_TASKS_PER_TENANT allows."""

    status = 429
    title = "Too Many Requests"
    type_slug = "tenant-queue-full"


def tenant_queue_full(tenant_id: str, max_queued: int) -> TenantQueueFull:
    """Return the 429 (with ``Retry-After``) of a submission past the tenant's cap."""
    return TenantQueueFull(
        f"tenant {tenant_id!r} has {max_queued} queued tasks, the most "
        f"BERTH_MAX_QUEUED_TASKS_PER_TENANT allows; retry when some have started",
        extra={
            "maxQueuedTasks": max_queued,
            "headers": {"Retry-After": str(QUEUE_FULL_RETRY_AFTER_SECONDS)},
        },
    )


class SpecHasNul(Unprocessable):
    """The spec contains a NUL character (\\u0000), which no stored string may hold."""


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The active lease of a task, as the task view shows it."""

    id: uuid.UUID
    pool_id: str
    runtime_instance_id: str
    expires_at: datetime
    epoch: int
    #: ACTIVE, or REVOKING: the runtime is asked to stop by ``revoke_by`` (a preemption).
    state: Literal["ACTIVE", "REVOKING"] = "ACTIVE"
    revoke_by: datetime | None = None


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A stored task with its JSON columns decoded and its active leases."""

    id: uuid.UUID
    seq: int
    tenant_id: str
    state: str
    priority: int
    runtime_class: str
    spec: dict[str, Any]
    labels: dict[str, str]
    pending_reason: dict[str, Any] | None
    #: The placement as the reconciler stored it (JSON text, rendered by the API).
    placement: str | None
    attempts: int
    max_attempts: int
    failure_reason: str | None
    created_at: datetime
    updated_at: datetime
    leased_at: datetime | None
    finished_at: datetime | None
    admitted_at: datetime | None = None
    #: Stage of the pending reason's closest miss (None: not examined yet).
    pending_stage: int | None = None
    #: Wake keys while parked (``app.scheduling.parking``).
    wake: tuple[str, ...] = ()
    leases: tuple[LeaseView, ...] = ()
    #: Alternatives of the stored placement the tenant can no longer see (the pool stopped
    #: listing it, or is gone): explanations never name a pool the tenant cannot see.
    hidden_pool_ids: frozenset[str] = frozenset()
    created: bool = False


@dataclass(frozen=True, slots=True)
class TaskEventRow:
    """One transition of a task's history."""

    id: int
    at: datetime
    from_state: str | None
    to_state: str
    reason: str
    detail: dict[str, Any] | None


#: An escaped NUL in JSON: ``\u0000`` not itself preceded by an escaping backslash.
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

#: The end of both submit statements: an idempotency-key conflict inserts nothing, the
#: ADMITTED event follows the task, and the new task's seq is the answer.
_SUBMIT_TAIL = """
        ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id, seq
    ), ev AS (
        INSERT INTO task_events (task_id, at, from_state, to_state, reason)
        SELECT id, $11, NULL, 'ADMITTED', 'submitted' FROM ins
    )
    SELECT ins.seq FROM ins
"""

_SUBMIT = """
    WITH ins AS (
        INSERT INTO tasks (id, tenant_id, shard, state, priority, runtime_class, spec, labels,
                           max_attempts, idempotency_key, request_hash,
                           created_at, admitted_at, updated_at)
        VALUES ($1, $2, $3, 'ADMITTED', $4, $5, $6::json, $7::jsonb, $8, $9, $10, $11, $11, $11)
""" + _SUBMIT_TAIL

#: The same statement, inserting only while the tenant has fewer than $12 queued tasks.
#: (Parameters carry their types: in a SELECT they are not inferred from the columns.)
_SUBMIT_CAPPED = """
    WITH gate AS (
        SELECT coalesce(sum(queued), 0) AS queued FROM tenant_queue_counts WHERE tenant_id = $2
    ), ins AS (
        INSERT INTO tasks (id, tenant_id, shard, state, priority, runtime_class, spec, labels,
                           max_attempts, idempotency_key, request_hash,
                           created_at, admitted_at, updated_at)
        SELECT $1::uuid, $2::text, $3::int, 'ADMITTED', $4::int, $5::text, $6::json,
               $7::jsonb, $8::int, $9::text, $10::text, $11::timestamptz, $11, $11
        FROM gate WHERE gate.queued < $12::bigint
""" + _SUBMIT_TAIL

# The id is read as text: asyncpg's own UUID type is not one orjson serializes.
_COLUMNS = """
    t.id::text, t.seq, t.tenant_id, t.state, t.priority, t.runtime_class, t.spec,
    t.labels, t.pending_reason, t.placement, t.attempts, t.max_attempts,
    t.failure_reason, t.created_at, t.updated_at, t.leased_at, t.finished_at,
    t.admitted_at, t.pending_stage, t.wake,
    (SELECT coalesce(json_agg(json_build_object(
                'id', l.id, 'poolId', l.pool_id, 'runtimeInstanceId', l.runtime_instance_id,
                'expiresAt', l.expires_at, 'epoch', l.epoch, 'state', l.state,
                'revokeBy', l.revoke_by) ORDER BY l.pool_id), '[]')
       FROM leases l WHERE l.task_id = t.id AND l.state IN ('ACTIVE', 'REVOKING')),
    (SELECT coalesce(array_agg(a.pool_id ORDER BY a.i), '{}')
       FROM json_array_elements_text(t.placement::json->1)
            WITH ORDINALITY AS a(pool_id, i)
      WHERE a.i > 1
        AND NOT EXISTS (SELECT 1 FROM pools p
                         WHERE p.id = a.pool_id AND t.tenant_id = ANY(p.tenant_ids)))
"""

_GET = f"SELECT {_COLUMNS} FROM tasks t WHERE t.id = $1 AND t.tenant_id = ANY($2::text[])"

_BY_KEY = f"""
    SELECT {_COLUMNS}, t.request_hash FROM tasks t
    WHERE t.tenant_id = $1 AND t.idempotency_key = $2
"""


def _lease(entry: dict[str, Any]) -> LeaseView:
    return LeaseView(
        id=uuid.UUID(entry["id"]),
        pool_id=entry["poolId"],
        runtime_instance_id=entry["runtimeInstanceId"],
        expires_at=datetime.fromisoformat(entry["expiresAt"]),
        epoch=int(entry["epoch"]),
        state=entry.get("state") or "ACTIVE",
        revoke_by=datetime.fromisoformat(entry["revokeBy"]) if entry.get("revokeBy") else None,
    )


def _row(r: Any) -> TaskRow:
    """Return a row of ``_COLUMNS`` as a TaskRow."""
    return TaskRow(
        id=uuid.UUID(r[0]),
        seq=r[1],
        tenant_id=r[2],
        state=r[3],
        priority=r[4],
        runtime_class=r[5],
        spec=r[6],
        labels=r[7],
        pending_reason=r[8],
        placement=r[9],
        attempts=r[10],
        max_attempts=r[11],
        failure_reason=r[12],
        created_at=r[13],
        updated_at=r[14],
        leased_at=r[15],
        finished_at=r[16],
        admitted_at=r[17],
        pending_stage=r[18],
        wake=tuple(r[19] or ()),
        leases=tuple(_lease(e) for e in r[20]),
        hidden_pool_ids=frozenset(r[21]),
    )


async def task_submit(
    conn: Connection,
    *,
    tenant_id: str,
    spec: dict[str, Any],
    idempotency_key: str | None,
    request_hash: str | None,
    now: datetime,
    max_queued: int = 0,
) -> TaskRow:
    """Store a validated spec (camelCase JSON) as an ADMITTED task (the caller wakes
    reconcilers once it is committed).

    With an ``idempotency_key`` already used by the tenant, return the original task
    (``created=False``) when ``request_hash`` is the same, else raise
    :class:`IdempotencyKeyReused`. With ``max_queued`` (0: no cap), raise
    :class:`TenantQueueFull` when the tenant has that many queued tasks already (a repeat
    of a stored submission still returns it). One statement does the check, the insert and the
    event: on an autocommit connection it is its own transaction.
    """
    spec_json = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)
    if b"\\u0000" in spec_json and _NUL.search(spec_json):
        # PostgreSQL text and jsonb cannot hold NUL; refuse it as invalid content, not a 500.
        raise SpecHasNul()
    digest = request_hash if idempotency_key is not None else None
    labels = spec.get("labels") or {}
    task_id = uuid7(now)
    priority = int(spec.get("priority", 0))
    max_attempts = int(spec.get("maxAttempts", 3))
    runtime_class = spec["runtimeClass"]
    args: tuple[Any, ...] = (max_queued,) if max_queued > 0 else ()
    seq = await conn.fetchval(
        _SUBMIT_CAPPED if args else _SUBMIT,
        task_id,
        tenant_id,
        shard_of(tenant_id),
        priority,
        runtime_class,
        spec_json,
        labels,
        max_attempts,
        idempotency_key,
        digest,
        now,
        *args,
    )
    if seq is not None:
        return TaskRow(
            id=task_id,
            seq=seq,
            tenant_id=tenant_id,
            state="ADMITTED",
            priority=priority,
            runtime_class=runtime_class,
            spec=spec,
            labels=labels,
            pending_reason=None,
            placement=None,
            attempts=0,
            max_attempts=max_attempts,
            failure_reason=None,
            created_at=now,
            updated_at=now,
            leased_at=None,
            finished_at=None,
            created=True,
        )
    return await _submit_refused(conn, tenant_id, idempotency_key, digest, max_queued)


async def _submit_refused(
    conn: Connection, tenant_id: str, idempotency_key: str | None, digest: str | None,
    max_queued: int,
) -> TaskRow:
    """Return the task stored under the tenant's ``idempotency_key`` for the same request;
    else raise why the submission stored nothing (the queue cap, or the key in use)."""
    # Refused by the cap, or the key is taken: by a committed task, or by one whose
    # transaction we just waited for.
    existing = None
    if idempotency_key is not None:
        existing = await conn.fetchrow(_BY_KEY, tenant_id, idempotency_key)
    if existing is None and max_queued > 0:
        raise tenant_queue_full(tenant_id, max_queued)
    if existing is None:  # pragma: no cover - the unique index guarantees a winner exists
        raise IdempotencyKeyReused("the Idempotency-Key is in use by a concurrent request")
    if existing["request_hash"] != digest:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used with a different request body; "
            "use a new key for a new task"
        )
    return _row(existing)


async def task_get(
    conn: Connection, *, task_id: uuid.UUID, tenant_ids: Collection[str]
) -> TaskRow | None:
    """Return the task ``task_id`` if it belongs to one of ``tenant_ids``, else None."""
    row = await conn.fetchrow(_GET, task_id, list(tenant_ids))
    return _row(row) if row is not None else None


async def task_list(
    conn: Connection,
    *,
    tenant_ids: Collection[str],
    after_seq: int | None = None,
    state: str | None = None,
    runtime_class: str | None = None,
    limit: int = 100,
) -> tuple[list[TaskRow], int | None]:
    """Return a page of the tenants' tasks in admission order and the cursor seq of the next."""
    where = ["t.tenant_id = ANY($1::text[])", "t.seq > $2"]
    args: list[Any] = [list(tenant_ids), after_seq if after_seq is not None else 0]
    if state is not None:
        args.append(state)
        where.append(f"t.state = ${len(args)}")
    if runtime_class is not None:
        args.append(runtime_class)
        where.append(f"t.runtime_class = ${len(args)}")
    args.append(limit + 1)
    sql = (
        f"SELECT {_COLUMNS} FROM tasks t WHERE {' AND '.join(where)} "
        f"ORDER BY t.seq LIMIT ${len(args)}"
    )
    rows = [_row(r) for r in await conn.fetch(sql, *args)]
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, rows[-1].seq
    return rows, None


_EVENTS = """
    SELECT e.id, e.at, e.from_state, e.to_state, e.reason, e.detail
    FROM task_events e
    WHERE e.task_id = $1 AND e.id > $2
    ORDER BY e.id
    LIMIT $3
"""


async def task_events_list(
    conn: Connection, *, task_id: uuid.UUID, after_id: int = 0, limit: int = 100
) -> tuple[list[TaskEventRow], int | None]:
    """Return a page of a task's transitions, oldest first, and the cursor id of the next."""
    rows = await conn.fetch(_EVENTS, task_id, after_id, limit + 1)
    events = [TaskEventRow(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows[:limit]]
    return events, (events[-1].id if len(rows) > limit else None)
