"""Queue SQL: a waiting task's position and the facts behind its ETA, and what is pending.

Every read is bounded. Position counts read ranges of the competing-queue indexes of the
task's runtime class (``ix_tasks_queue_seq``, ``ix_tasks_queue_priority``: tasks waiting that
released capacity could help) and stop after ``limit`` rows, so a read never scans the whole
queue; when a count reaches the limit it is reported as a lower bound (``exact`` False).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.db import Connection

__all__ = [
    "QueuePosition",
    "pools_completions_count",
    "pools_largest_totals",
    "pools_operated",
    "queue_pending_by_code",
    "queue_pending_counts",
    "task_queue_position",
]

_COMPETING = (
    "state IN ('ADMITTED', 'CLAIMED') AND (pending_stage IS NULL OR pending_stage >= 4)"
)


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """Tasks ahead of a task under the policy, tasks competing with it, and whether both
    counts are exact (False: at least these many)."""

    ahead: int
    competing: int
    exact: bool


# $1 class, $2 seq, $3 limit.
_FIFO = (
    f"SELECT count(*) FROM (SELECT 1 FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "AND seq < $2 LIMIT $3) x"
)
# $1 class, $2 limit.
_COMPETING_COUNT = (
    f"SELECT count(*) FROM (SELECT 1 FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "LIMIT $2) x"
)
# Priority with aging: j is ahead of i when priority_j + wait_j / A > priority_i + wait_i / A,
# i.e. admitted_j < admitted_i + (priority_j - priority_i) * A (admission order on a tie).
# A loose index scan lists the priorities present (highest first, at most $2); each is then
# one bounded range count. $1 class, $2 most priorities.
_PRIORITIES = (
    "WITH RECURSIVE ps AS ("
    f"(SELECT priority FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "ORDER BY priority DESC LIMIT 1) "
    "UNION ALL SELECT (SELECT priority FROM tasks WHERE runtime_class = $1 "
    f"AND {_COMPETING} AND priority < ps.priority ORDER BY priority DESC LIMIT 1) "
    "FROM ps WHERE ps.priority IS NOT NULL) "
    "SELECT priority FROM ps WHERE priority IS NOT NULL LIMIT $2"
)
# $1 class, $2 priority, $3 admitted bound, $4 limit, $5 the task's seq and admission (ties).
_PRIORITY_AHEAD = (
    f"SELECT count(*) FROM (SELECT 1 FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "AND priority = $2 AND (admitted_at < $3 OR (admitted_at = $3 AND seq < $5)) "
    "LIMIT $4) x"
)
#: Most distinct priorities (or tenants, under fair) one position read visits.
GROUPS_MAX = 256
# Fair: the tenants present in the class (loose index scan). $1 class, $2 most tenants.
_TENANTS = (
    "WITH RECURSIVE ts AS ("
    f"(SELECT tenant_id FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "ORDER BY tenant_id LIMIT 1) "
    "UNION ALL SELECT (SELECT tenant_id FROM tasks WHERE runtime_class = $1 "
    f"AND {_COMPETING} AND tenant_id > ts.tenant_id ORDER BY tenant_id LIMIT 1) "
    "FROM ts WHERE ts.tenant_id IS NOT NULL) "
    "SELECT tenant_id FROM ts WHERE tenant_id IS NOT NULL LIMIT $2"
)
# A tenant's competing tasks older than seq $3, at most $4. $1 class, $2 tenant.
_TENANT_AHEAD = (
    f"SELECT count(*) FROM (SELECT 1 FROM tasks WHERE runtime_class = $1 AND {_COMPETING} "
    "AND tenant_id = $2 AND seq < $3 LIMIT $4) x"
)


async def task_queue_position(
    conn: Connection,
    *,
    runtime_class: str,
    tenant_id: str,
    seq: int,
    priority: int,
    admitted_at: datetime,
    policy: str,
    aging_seconds: float,
    limit: int,
) -> QueuePosition:
    """Return where the task stands under ``policy`` among the competing tasks of its
    runtime class, counting at most ``limit`` rows per read."""
    competing = int(await conn.fetchval(_COMPETING_COUNT, runtime_class, limit))
    exact = competing < limit
    if policy == "priority":
        # Each priority's count is bounded by what is left of ``limit``: at most ``limit``
        # rows in all.
        ahead = 0
        for (p,) in await conn.fetch(_PRIORITIES, runtime_class, GROUPS_MAX):
            if ahead >= limit:
                break
            bound = admitted_at + timedelta(seconds=(p - priority) * float(aging_seconds))
            ahead += int(await conn.fetchval(
                _PRIORITY_AHEAD, runtime_class, p, bound, limit - ahead, seq))
    elif policy == "fair":
        # Dominant-resource fairness between tenants of equal shares is a round robin in
        # tenant-id order (the policy's tie-break): before the task's turn, every other
        # tenant has had ``own`` turns, one more if its id sorts first.
        own = int(await conn.fetchval(_TENANT_AHEAD, runtime_class, tenant_id, seq, limit))
        ahead = own
        for (other,) in await conn.fetch(_TENANTS, runtime_class, GROUPS_MAX):
            if other == tenant_id:
                continue
            if ahead >= limit:
                break
            turns = min(own + (1 if other < tenant_id else 0), limit - ahead)
            if turns > 0:
                ahead += int(await conn.fetchval(
                    _TENANT_AHEAD, runtime_class, other, 2**62, turns))
    else:
        ahead = int(await conn.fetchval(_FIFO, runtime_class, seq, limit))
    exact = exact and ahead < limit
    return QueuePosition(ahead=ahead, competing=competing, exact=exact)


# $1 tenant, $2 class, $3 pool ids (NULL: every pool of the class open to the tenant),
# $4 since.
_COMPLETIONS = (
    "SELECT count(DISTINCT p.id), count(l.id) FROM pools p "
    "LEFT JOIN leases l ON l.pool_id = p.id AND l.state = 'COMPLETED' AND l.ended_at >= $4 "
    "WHERE $1 = ANY(p.tenant_ids) AND p.runtime_class = $2 "
    "AND ($3::text[] IS NULL OR p.id = ANY($3::text[]))"
)


async def pools_completions_count(
    conn: Connection,
    *,
    tenant_id: str,
    runtime_class: str,
    pool_ids: Collection[str] | None,
    since: datetime,
) -> tuple[int, int]:
    """Return (candidate pools, leases completed on them since ``since``); the candidates
    are ``pool_ids`` (or every pool of the class open to the tenant), visible ones only."""
    row = await conn.fetchrow(
        _COMPLETIONS, tenant_id, runtime_class,
        None if pool_ids is None else sorted(pool_ids), since,
    )
    return int(row[0]), int(row[1])


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
    "WHERE t.state IN ('ADMITTED', 'CLAIMED') "
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
    "WHERE state IN ('ADMITTED', 'CLAIMED') AND shard = ANY($1::int[]) GROUP BY 1"
)


async def queue_pending_by_code(
    conn: Connection, *, slots: Collection[int]
) -> list[tuple[str, int, int]]:
    """Return (pending code, waiting tasks, parked tasks) of the waiting tasks of ``slots``."""
    if not slots:
        return []
    return [(r[0], int(r[1]), int(r[2])) for r in await conn.fetch(_BY_CODE, sorted(slots))]
