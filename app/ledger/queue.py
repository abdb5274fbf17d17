"""Queue SQL: the competing queue of a runtime class, the facts behind an ETA, and what is
pending.

Every read is bounded: the class queue reads one range of ``ix_tasks_queue_seq`` (waiting
tasks that released capacity could help) up to ``limit`` rows (and the tenant lists of the
class's pools), the completions read at most
``limit`` recent leases, and the pending counts are grouped in the database.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

import orjson

from app.db import Connection

__all__ = [
    "QueueColumns",
    "pools_completions_count",
    "pools_largest_totals",
    "pools_operated",
    "queue_pending_by_code",
    "queue_class_read",
    "queue_pending_counts",
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


# $1 tenant, $2 class, $3 pool ids (NULL: every pool of the class open to the tenant),
# $4 since, $5 most completions counted.
_COMPLETIONS = (
    "SELECT (SELECT count(*) FROM pools p WHERE $1 = ANY(p.tenant_ids) "
    "AND p.runtime_class = $2 AND ($3::text[] IS NULL OR p.id = ANY($3::text[]))), "
    "count(*), min(ended_at) FROM (SELECT l.ended_at FROM leases l JOIN pools p "
    "ON p.id = l.pool_id WHERE l.state = 'COMPLETED' AND l.ended_at >= $4 "
    "AND $1 = ANY(p.tenant_ids) AND p.runtime_class = $2 "
    "AND ($3::text[] IS NULL OR p.id = ANY($3::text[])) "
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
) -> tuple[int, int, datetime | None]:
    """Return (candidate pools, leases completed on them since ``since`` — at most
    ``limit``, the most recent —, the oldest of those counted); the candidates are
    ``pool_ids`` (or every pool of the class open to the tenant), visible ones only."""
    row = await conn.fetchrow(
        _COMPLETIONS, tenant_id, runtime_class,
        None if pool_ids is None else sorted(pool_ids), since, limit,
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
