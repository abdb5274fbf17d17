"""Ledger arithmetic: reserve and release capacity on pools, always in pool-id lock order.

Every statement that changes several ``ledgers`` rows goes through :data:`_LOCKED`, a CTE
that locks the rows with ``FOR UPDATE`` sorted by pool id, evaluated as a one-time filter
before the ``UPDATE`` reads any row. Whatever plan the update itself gets, every row is
locked first, in pool-id order, so two transactions that change overlapping sets of pools
wait for each other instead of deadlocking (a plain multi-row
``UPDATE … FROM (VALUES …)`` locks in the planner's scan order and does deadlock).
Callers issue the ledger statement last before COMMIT so the hot rows are held briefly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime

from app.db import Connection
from app.ledger.literals import ids_joined, ints_joined
from app.ledger.quotas import RETURN_CTES
from app.scheduling.records import Vector

# The amounts arrive as arrays (sent as delimited texts, see app.ledger.literals) joined
# through unnest, and the lock CTE is consumed by a one-time filter (``(SELECT count(*) FROM
# locked) > 0``), never joined: the filter runs before the update reads its first row, so
# every row is locked in pool-id order first, and no plan (a cached generic plan guesses 10
# array elements) can pair each ledger row with every element of the batch.
# The pools as an array: the ledger rows are found by it (a filter on ``pk_ledgers`` or a scan),
# not by joining ``v``, for which the planner hashes every ledger row (5,000 at 5,000 pools)
# for each of the two joins.
_POOLS = "string_to_array($1::text, ',')"
_LOCKED = (
    "WITH v AS (SELECT * FROM unnest(string_to_array($1::text, ','), "
    "string_to_array($2::text, ',')::bigint[], string_to_array($3::text, ',')::bigint[], "
    "string_to_array($4::text, ',')::bigint[]) AS v(pool_id, cpu, memory, llm)), "
    "locked AS (SELECT l.pool_id FROM ledgers l WHERE l.pool_id = ANY(" + _POOLS + ") "
    "ORDER BY l.pool_id FOR UPDATE OF l) "
)

_RESERVE = (
    _LOCKED
    + "UPDATE ledgers l SET cpu_reserved = l.cpu_reserved + v.cpu, "
    "memory_reserved = l.memory_reserved + v.memory, llm_reserved = l.llm_reserved + v.llm, "
    "updated_at = $5 "
    "FROM v WHERE l.pool_id = ANY(" + _POOLS + ") AND v.pool_id = l.pool_id "
    "AND (SELECT count(*) FROM locked) > 0 AND l.cpu_reserved + v.cpu <= l.cpu_total "
    "AND l.memory_reserved + v.memory <= l.memory_total "
    "AND l.llm_reserved + v.llm <= l.llm_total "
    "RETURNING l.pool_id"
)

# The same, for a transaction that already holds some of the rows: rows another transaction
# holds are skipped (refused) instead of waited for. A second ledger statement of one
# transaction could otherwise wait while holding rows locked by the first, out of pool-id
# order, and deadlock with another transaction's first statement.
_RESERVE_HELD = (
    "WITH v AS (SELECT * FROM unnest(string_to_array($1::text, ','), "
    "string_to_array($2::text, ',')::bigint[], string_to_array($3::text, ',')::bigint[], "
    "string_to_array($4::text, ',')::bigint[]) AS v(pool_id, cpu, memory, llm)), "
    "locked AS (SELECT l.pool_id FROM ledgers l WHERE l.pool_id = ANY(" + _POOLS + ") "
    "ORDER BY l.pool_id FOR UPDATE OF l SKIP LOCKED) "
    "UPDATE ledgers l SET cpu_reserved = l.cpu_reserved + v.cpu, "
    "memory_reserved = l.memory_reserved + v.memory, llm_reserved = l.llm_reserved + v.llm, "
    "updated_at = $5 "
    "FROM v JOIN locked k ON k.pool_id = v.pool_id WHERE l.pool_id = ANY(" + _POOLS + ") "
    "AND v.pool_id = l.pool_id "
    "AND l.cpu_reserved + v.cpu <= l.cpu_total "
    "AND l.memory_reserved + v.memory <= l.memory_total "
    "AND l.llm_reserved + v.llm <= l.llm_total "
    "RETURNING l.pool_id"
)

_RELEASE = (
    _LOCKED
    + "UPDATE ledgers l SET cpu_reserved = l.cpu_reserved - v.cpu, "
    "memory_reserved = l.memory_reserved - v.memory, llm_reserved = l.llm_reserved - v.llm, "
    "updated_at = $5 "
    "FROM v WHERE l.pool_id = ANY(" + _POOLS + ") AND v.pool_id = l.pool_id "
    "AND (SELECT count(*) FROM locked) > 0"
)

# The tasks' reservations go, and with those of leases (not holds) their tenants' quota
# usage (app.ledger.quotas), in one statement.
_RESERVATIONS_DELETE = (
    "WITH d AS (DELETE FROM reservations WHERE task_id = ANY($1::uuid[]) "
    "RETURNING task_id, pool_id, cpu, memory, llm, hold), "
    "gone AS (SELECT task_id, pool_id, cpu, memory, llm FROM d WHERE NOT hold), "
    + RETURN_CTES
    + "SELECT pool_id, cpu, memory, llm FROM d WHERE (SELECT n FROM gone_cohort) >= 0"
)


def _columns(amounts: Mapping[str, Vector]) -> tuple[str, str, str, str]:
    pools = sorted(amounts)
    return (
        ids_joined(pools),
        ints_joined([int(amounts[p][0]) for p in pools]),
        ints_joined([int(amounts[p][1]) for p in pools]),
        ints_joined([int(amounts[p][2]) for p in pools]),
    )


def amounts_sum(rows: Iterable[tuple[str, int, int, int]]) -> dict[str, Vector]:
    """Return per-pool sums of ``(pool_id, cpu, memory, llm)`` rows."""
    out: dict[str, list[int]] = {}
    for pool_id, cpu, memory, llm in rows:
        acc = out.setdefault(pool_id, [0, 0, 0])
        acc[0] += cpu
        acc[1] += memory
        acc[2] += llm
    return {p: (a[0], a[1], a[2]) for p, a in out.items()}


async def ledger_reserve_many(
    conn: Connection, *, amounts: Mapping[str, Vector], now: datetime, wait: bool = True
) -> set[str]:
    """Add ``amounts`` to the pools whose totals still hold them; return the pools updated.

    A pool missing from the result lost a race: adding its amount would exceed a total, so
    nothing was added there. Every row named is locked (in pool-id order) until the
    transaction ends, refused or not. With ``wait`` False, a row another transaction holds
    is refused instead of waited for (use it for every ledger statement of a transaction
    after its first).
    """
    if not amounts:
        return set()
    rows = await conn.fetch(_RESERVE if wait else _RESERVE_HELD, *_columns(amounts), now)
    return {r[0] for r in rows}


async def ledger_release_many(
    conn: Connection, *, amounts: Mapping[str, Vector], now: datetime
) -> None:
    """Subtract ``amounts`` from the pools' reserved totals."""
    if amounts:
        await conn.execute(_RELEASE, *_columns(amounts), now)


async def reservations_release(
    conn: Connection, *, task_ids: Iterable[uuid.UUID], now: datetime
) -> dict[str, Vector]:
    """Delete the tasks' reservations and return them to their pools' ledgers (and those of
    leases to their tenants' quota usage).

    Returns the released amounts by pool. The caller has locked the task rows, and nothing
    else deletes reservations of a locked task, so the ledger stays equal to the sum of its
    live reservations at commit.
    """
    ids = list(task_ids)
    if not ids:
        return {}
    rows = await conn.fetch(_RESERVATIONS_DELETE, ids)
    released = amounts_sum((r[0], r[1], r[2], r[3]) for r in rows)
    await ledger_release_many(conn, amounts=released, now=now)
    return released
