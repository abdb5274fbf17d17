"""Queue SQL: the competing queue of a runtime class, the facts behind an ETA, and what is
pending.

Every read is bounded: the class queue reads one range of ``ix_tasks_queue_seq`` (waiting
tasks that released capacity could help) up to ``limit`` rows (and the tenant lists of the
class's pools), the tasks ahead of one task and the live leases an ETA lets end read at most
``limit`` rows each, the completions read at most ``limit`` recent leases, and the pending
counts are grouped in the database.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

import orjson

from app.db import Connection
from app.scheduling.records import ClaimedTask, LiveLease

__all__ = [
    "QueueColumns",
    "leases_live_oldest",
    "pools_completions_count",
    "pools_largest_totals",
    "pools_operated",
    "queue_pending_by_code",
    "queue_class_read",
    "queue_pending_counts",
    "queue_task_read",
    "queue_tasks_ahead",
]

#: Waiting tasks (ADMITTED; CLAIMED is not stored since 0008_pass), one arm per partial
#: index that covers it (claimable, parked): a query with this predicate gets a BitmapOr of
#: those indexes and never reads finished tasks, while ``state = 'ADMITTED'`` alone matches
#: no index and scans the whole table, history included (230 ms at 1,000,000 finished tasks).
WAITING = "((state = 'ADMITTED' AND NOT parked) OR (state = 'ADMITTED' AND parked))"

_COMPETING = (
    "state IN ('ADMITTED', 'CLAIMED') AND (pending_stage IS NULL OR pending_stage >= 4)"
)


@dataclass(frozen=True, slots=True)
class QueueColumns:
    """Competing tasks of a runtime class in admission order, one list per column.

    Columns rather than a row object per task: a snapshot of 10,000 tasks is then four lists
    of numbers and strings, which the garbage collector does not track, instead of 10,000
    containers it would scan (and collect) on every refresh.
    """

    seqs: list[int]
    tenant_ids: list[str]
    priorities: list[int]
    #: ``admitted_at`` in seconds since the epoch (what ``datetime.timestamp()`` gives).
    admitted: list[float]
    #: The tenant list of each pool of the class (who may compete with whom).
    pool_tenants: list[list[str]]


# $1 class, $2 limit: the oldest competing tasks of the class, in admission order (one range
# of ix_tasks_queue_seq), as one row of arrays, and the tenant lists of the class's pools
# (JSON text: an array of arrays).
_CLASS_QUEUE = (
    "SELECT coalesce(array_agg(seq ORDER BY seq), '{}'), "
    "coalesce(array_agg(tenant_id ORDER BY seq), '{}'), "
    "coalesce(array_agg(priority ORDER BY seq), '{}'), "
    "coalesce(array_agg(extract(epoch FROM admitted_at)::float8 ORDER BY seq), '{}'), "
    "(SELECT coalesce(json_agg(p.tenant_ids), '[]')::text FROM pools p "
    "WHERE p.runtime_class = $1) "
    "FROM (SELECT seq, tenant_id, priority, admitted_at FROM tasks "
    f"WHERE runtime_class = $1 AND {_COMPETING} ORDER BY seq LIMIT $2) q"
)


async def queue_class_read(
    conn: Connection, *, runtime_class: str, limit: int
) -> QueueColumns:
    """Return the oldest ``limit`` competing tasks of ``runtime_class`` in admission order
    (fewer than ``limit``: the whole competing queue of the class), with the tenant lists of
    the class's pools."""
    row = await conn.fetchrow(_CLASS_QUEUE, runtime_class, limit)
    return QueueColumns(row[0], row[1], row[2], row[3], orjson.loads(row[4]))


# What a pass claims of a task (app.ledger.claims' columns), as the planner takes it.
_TASK_COLUMNS = (
    "id, tenant_id, seq, priority, spec::text, admitted_at, attempts, "
    "pending_reason ->> 'code', pending_reason::text, pending_stage, logged_code, logged_at, "
    "logged_count"
)


async def queue_task_read(conn: Connection, *, task_id: uuid.UUID) -> ClaimedTask | None:
    """Return an ADMITTED task as a pass would claim it (None: it is not ADMITTED)."""
    row = await conn.fetchrow(
        f"SELECT {_TASK_COLUMNS} FROM tasks WHERE id = $1 AND state = 'ADMITTED'", task_id)
    return None if row is None else ClaimedTask._make(row)


# $1 class, $2 limit: the competing tasks of the class in admission order (one range of
# ix_tasks_queue_seq).
_AHEAD = (
    f"SELECT {_TASK_COLUMNS} FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "ORDER BY seq LIMIT $2"
)
# $1 class, $2 limit, $3 aging seconds: by effective priority, priority plus one point per
# aging period waited (``priority - admitted / aging`` orders them the same at any time).
_AHEAD_PRIORITY = (
    f"SELECT {_TASK_COLUMNS} FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "ORDER BY extract(epoch FROM admitted_at) / $3::float8 - priority, seq LIMIT $2"
)


async def queue_tasks_ahead(
    conn: Connection, *, runtime_class: str, limit: int, aging_seconds: float | None
) -> list[ClaimedTask]:
    """Return the first ``limit`` competing tasks of ``runtime_class`` as a pass would claim
    them: in admission order, or with ``aging_seconds`` by effective priority."""
    if aging_seconds is None:
        rows = await conn.fetch(_AHEAD, runtime_class, limit)
    else:
        rows = await conn.fetch(_AHEAD_PRIORITY, runtime_class, limit, aging_seconds)
    return [ClaimedTask._make(r) for r in rows]


# $1 pools, $2 tenant (NULL: any), $3 limit: the oldest live leases of the pools with what
# each reserves there (a hold is no lease's).
_LIVE = (
    "SELECT l.pool_id, t.tenant_id, t.runtime_class, r.cpu, r.memory, r.llm, l.granted_at "
    "FROM leases l JOIN reservations r ON r.task_id = l.task_id AND r.pool_id = l.pool_id "
    "AND NOT r.hold JOIN tasks t ON t.id = l.task_id "
    "WHERE l.state IN ('ACTIVE', 'REVOKING') AND l.pool_id = ANY($1::text[]) "
    "AND ($2::text IS NULL OR t.tenant_id = $2) ORDER BY l.granted_at, l.id LIMIT $3"
)


async def leases_live_oldest(
    conn: Connection, *, pool_ids: Collection[str], tenant_id: str | None, limit: int
) -> list[LiveLease]:
    """Return the oldest ``limit`` live leases on ``pool_ids`` (of ``tenant_id`` only, when
    given), oldest first."""
    rows = await conn.fetch(_LIVE, sorted(pool_ids), tenant_id, limit)
    return [LiveLease(r[0], r[1], r[2], (int(r[3]), int(r[4]), int(r[5])), r[6])
            for r in rows]


# $1 tenant, $2 class, $3 pool ids (NULL: every pool of the class open to the tenant),
# $4 since, $5 most completions counted, $6 lessee (NULL: any tenant's leases).
_COMPLETIONS = (
    "SELECT (SELECT count(*) FROM pools p WHERE $1 = ANY(p.tenant_ids) "
    "AND p.runtime_class = $2 AND ($3::text[] IS NULL OR p.id = ANY($3::text[]))), "
    "count(*), min(ended_at) FROM (SELECT l.ended_at FROM leases l JOIN pools p "
    "ON p.id = l.pool_id WHERE l.state = 'COMPLETED' AND l.ended_at >= $4 "
    "AND $1 = ANY(p.tenant_ids) AND p.runtime_class = $2 "
    "AND ($3::text[] IS NULL OR p.id = ANY($3::text[])) "
    "AND ($6::text IS NULL OR EXISTS (SELECT 1 FROM tasks t WHERE t.id = l.task_id "
    "AND t.tenant_id = $6)) "
    "ORDER BY l.ended_at DESC LIMIT $5) x"
)


async def pools_completions_count(
    conn: Connection,
    *,
    tenant_id: str,
    runtime_class: str,
    pool_ids: Collection[str] | None,
    since: datetime,
    limit: int = 1000,
    lessee: str | None = None,
) -> tuple[int, int, datetime | None]:
    """Return (candidate pools, leases completed on them since ``since`` — at most
    ``limit``, the most recent, of ``lessee``'s tasks only when given —, the oldest of those
    counted); the candidates are ``pool_ids`` (or every pool of the class open to the
    tenant), visible ones only."""
    row = await conn.fetchrow(
        _COMPLETIONS, tenant_id, runtime_class,
        None if pool_ids is None else sorted(pool_ids), since, limit, lessee,
    )
    return int(row[0]), int(row[1]), row[2]


_LARGEST = (
    "SELECT max(l.cpu_total), max(l.memory_total), max(l.llm_total) FROM pools p "
    "JOIN ledgers l ON l.pool_id = p.id WHERE $1 = ANY(p.tenant_ids) AND p.runtime_class = $2"
)


async def pools_largest_totals(
    conn: Connection, *, tenant_id: str, runtime_class: str
) -> tuple[int, int, int] | None:
    """Return the largest ledger totals per dimension among the pools of the class open to
    the tenant (None: no such pool has a ledger)."""
    row = await conn.fetchrow(_LARGEST, tenant_id, runtime_class)
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1]), int(row[2])


# $1 tenants (NULL: any), $2 pools (NULL: any; else tasks whose tenant one of them lists
# and whose class one of them runs), $3 now.
_PENDING = (
    "WITH scope AS (SELECT DISTINCT unnest(tenant_ids) AS tenant_id, runtime_class "
    "FROM pools WHERE id = ANY($2::text[])), "
    "q AS (SELECT t.runtime_class, coalesce(t.pending_reason ->> 'code', 'unexamined') AS code, "
    "t.parked, t.admitted_at FROM tasks t "
    f"WHERE {WAITING} "
    "AND ($1::text[] IS NULL OR t.tenant_id = ANY($1::text[])) "
    "AND ($2::text[] IS NULL OR EXISTS (SELECT 1 FROM scope s "
    "WHERE s.tenant_id = t.tenant_id AND s.runtime_class = t.runtime_class))) "
    "SELECT runtime_class, code, count(*), count(*) FILTER (WHERE parked), min(admitted_at) "
    "FROM q GROUP BY 1, 2 ORDER BY 1, 2"
)


async def queue_pending_counts(
    conn: Connection,
    *,
    tenant_ids: Collection[str] | None,
    pool_ids: Collection[str] | None,
) -> list[tuple[str, str, int, int, datetime]]:
    """Return (runtime class, pending code, tasks, parked, oldest admission) of the waiting
    tasks in scope: of ``tenant_ids`` (None: all), and that ``pool_ids`` could serve (None:
    no pool restriction)."""
    rows = await conn.fetch(
        _PENDING,
        None if tenant_ids is None else sorted(tenant_ids),
        None if pool_ids is None else sorted(pool_ids),
    )
    return [(r[0], r[1], int(r[2]), int(r[3]), r[4]) for r in rows]


async def pools_operated(conn: Connection, *, subject: str) -> list[str]:
    """Return the ids of the pools ``subject`` operates."""
    return [r[0] for r in await conn.fetch(
        "SELECT id FROM pools WHERE $1 = ANY(operators) ORDER BY id", subject)]


# $1 slots.
_BY_CODE = (
    "SELECT coalesce(pending_reason ->> 'code', 'unexamined'), count(*), "
    "count(*) FILTER (WHERE parked) FROM tasks "
    f"WHERE {WAITING} AND shard = ANY($1::int[]) GROUP BY 1"
)


async def queue_pending_by_code(
    conn: Connection, *, slots: Collection[int]
) -> list[tuple[str, int, int]]:
    """Return (pending code, waiting tasks, parked tasks) of the waiting tasks of ``slots``."""
    if not slots:
        return []
    return [(r[0], int(r[1]), int(r[2])) for r in await conn.fetch(_BY_CODE, sorted(slots))]
