"""The minimal SQL floor: the least database work any placement needs, on its own tables.

The SQL floor of :mod:`bench.floor` runs on Berth's schema, so it moves when that schema
does (a column, an index, a trigger more or less). This floor does not: it runs on three
tables of its own with ``bigint`` keys, as small as a placement with a durable ledger
allows, in a fresh database of the same server. ``berth bench e2e`` runs it in the same run
on the same number of tasks and pools and reports ``fractionOfMinimalFloor`` = Berth's
placements/s over this floor's.

* ``ledgers (pool_id, cpu/memory/llm totals and reserved)``, one row per pool of the
  dataset, with its totals;
* ``tasks (id, pool_id, cpu, memory, llm, leased_at)``: ``id`` is the admission order;
  ``pool_id`` is the task's anchor pool (the pool the SQL floor on Berth's schema places it
  on, :func:`bench.floor.floor_anchors`) and the amounts are members times its requests,
  all decided before the clock; a task waits while ``leased_at`` is null, and a partial
  index on ``id`` of the waiting tasks serves the claim;
* ``leases (id, task_id, pool_id, expires_at)``.

Before the clock the ledgers and the waiting tasks are copied in, in one transaction, and
analysed. Then each of ``clients`` asyncpg connections (default 4, in one process) repeats,
one transaction per loop, until a claim comes back empty:

1. claim up to ``batch`` (default 64) waiting tasks in admission order with
   ``FOR UPDATE SKIP LOCKED``;
2. add their amounts to the ledgers in ONE conditional multi-row ``UPDATE``, its rows locked
   in pool-id order first (``reserved + request <= total`` on every dimension);
3. in one statement, insert one lease per task and set each task's ``leased_at``; commit
   (durably, as the server is configured).

**Why Berth cannot beat it.** A placement with a durable ledger cannot do less: claim the
task so that one placer has it (a row lock), take the capacity on its pool, give its runtime
a lease, mark the task placed. Here the last three are one row write each (a ledger row per
pool of a batch), with bigint keys and no more columns or indexes than Berth's tables of the
same names have, and nothing is decided: the clients only carry the claimed amounts to the
two writes. Berth writes the same rows and more (a reservation, a task event, the
placement), on wider tasks and leases rows with several indexes each, and decides. Berth
claims more tasks per pass (1,024 by default) than this floor per transaction (64), which
saves it commits and ledger updates: that is the one thing it does more cheaply. After the
run :func:`minimal_floor_check` checks the floor's invariants: no ledger over its totals,
every ledger equal to the sum of what its leases hold, every task leased exactly once, on
its anchor pool.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from bench.database import bench_connect
from bench.dataset import Dataset
from bench.floor import (
    FLOOR_BATCH,
    FloorResult,
    FloorStatements,
    floor_anchors,
    floor_clients_serve,
    floor_workers_run,
)

__all__ = ["minimal_floor_check", "minimal_floor_prepare", "minimal_floor_run"]

_TABLES = """
    CREATE TABLE ledgers (
        pool_id bigint PRIMARY KEY,
        cpu_total bigint NOT NULL, cpu_reserved bigint NOT NULL DEFAULT 0,
        memory_total bigint NOT NULL, memory_reserved bigint NOT NULL DEFAULT 0,
        llm_total bigint NOT NULL, llm_reserved bigint NOT NULL DEFAULT 0);
    CREATE TABLE tasks (
        id bigint PRIMARY KEY, pool_id bigint NOT NULL,
        cpu bigint NOT NULL, memory bigint NOT NULL, llm bigint NOT NULL,
        leased_at timestamptz);
    CREATE INDEX tasks_waiting ON tasks (id) WHERE leased_at IS NULL;
    CREATE TABLE leases (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, task_id bigint NOT NULL,
        pool_id bigint NOT NULL, expires_at timestamptz NOT NULL)"""

_CLAIM = """
    SELECT id, pool_id, cpu, memory, llm FROM tasks
    WHERE leased_at IS NULL AND NOT (id = ANY($2::bigint[]))
    ORDER BY id LIMIT $1
    FOR UPDATE SKIP LOCKED"""

_RESERVE = """
    WITH v AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
               AS v(pool_id, cpu, memory, llm)),
         locked AS (SELECT l.pool_id FROM ledgers l JOIN v ON v.pool_id = l.pool_id
                    ORDER BY l.pool_id FOR UPDATE OF l)
    UPDATE ledgers l SET cpu_reserved = l.cpu_reserved + v.cpu,
                         memory_reserved = l.memory_reserved + v.memory,
                         llm_reserved = l.llm_reserved + v.llm
    FROM v
    WHERE v.pool_id = l.pool_id AND (SELECT count(*) FROM locked) > 0
      AND l.cpu_reserved + v.cpu <= l.cpu_total
      AND l.memory_reserved + v.memory <= l.memory_total
      AND l.llm_reserved + v.llm <= l.llm_total
    RETURNING l.pool_id"""

_LEASE = """
    WITH x AS (SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS x(task_id, pool_id)),
         l AS (INSERT INTO leases (task_id, pool_id, expires_at)
               SELECT task_id, pool_id, now() + make_interval(secs => $3) FROM x)
    UPDATE tasks SET leased_at = now() WHERE id = ANY($1::bigint[])"""

#: Each invariant, as a count of the rows that break it (all zero after a sound run).
_CHECKS = {
    "ledger_over_total": """
        SELECT count(*) FROM ledgers WHERE cpu_reserved > cpu_total
            OR memory_reserved > memory_total OR llm_reserved > llm_total""",
    "reserved_not_sum_of_leases": """
        SELECT count(*) FROM ledgers l LEFT JOIN (
            SELECT s.pool_id, sum(t.cpu) cpu, sum(t.memory) memory, sum(t.llm) llm
            FROM leases s JOIN tasks t ON t.id = s.task_id GROUP BY s.pool_id) r
            ON r.pool_id = l.pool_id
        WHERE l.cpu_reserved <> coalesce(r.cpu, 0) OR l.memory_reserved <> coalesce(r.memory, 0)
            OR l.llm_reserved <> coalesce(r.llm, 0)""",
    "task_not_leased_once": """
        SELECT count(*) FROM tasks t LEFT JOIN (
            SELECT task_id, count(*) n FROM leases GROUP BY task_id) s ON s.task_id = t.id
        WHERE t.leased_at IS NULL OR coalesce(s.n, 0) <> 1""",
    "lease_off_its_anchor": """
        SELECT count(*) FROM leases s LEFT JOIN tasks t ON t.id = s.task_id
        WHERE t.id IS NULL OR s.pool_id <> t.pool_id""",
}


async def minimal_floor_prepare(url: str, ds: Dataset) -> None:
    """Create the floor's tables in the empty database ``url`` and copy in the dataset's
    ledgers and its tasks, waiting, with their anchor pools and amounts (before the clock)."""
    pool_keys = {ledger[0]: key for key, ledger in enumerate(ds.ledgers, 1)}
    ledgers = [(pool_keys[pool_id], cpu, memory, llm)
               for pool_id, cpu, memory, llm in ds.ledgers]
    tasks = [(task[0], pool_keys[pool_id], cpu, memory, llm)
             for task, (pool_id, _, cpu, memory, llm)
             in zip(ds.tasks, floor_anchors(ds), strict=True)]
    conn = await bench_connect(url)
    try:
        async with conn.transaction():
            await conn.execute(_TABLES)
            await conn.copy_records_to_table(
                "ledgers", records=ledgers,
                columns=("pool_id", "cpu_total", "memory_total", "llm_total"))
            await conn.copy_records_to_table(
                "tasks", records=tasks, columns=("id", "pool_id", "cpu", "memory", "llm"))
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


def _lease_args(placed: list[Any]) -> list[Any]:
    """Return the lease statement's ids and pools of the placed tasks."""
    return [[t[0] for t in placed], [t[1] for t in placed]]


async def minimal_floor_check(url: str) -> dict[str, Any]:
    """Return the floor's invariants as counts of the rows breaking each (zero when sound),
    with the tasks leased."""
    conn = await bench_connect(url)
    try:
        counts = {name: int(await conn.fetchval(sql)) for name, sql in _CHECKS.items()}
        leased = int(await conn.fetchval("SELECT count(*) FROM tasks WHERE leased_at IS NOT NULL"))
    finally:
        await conn.close()
    return {"invariants": counts, "leased": leased}


def minimal_floor_run(
    url: str, database: str, *, clients: int = 4, batch: int = FLOOR_BATCH,
    lease_ttl_seconds: float = 3600.0,
) -> FloorResult:
    """Run the floor's ``clients`` connections (one worker process) until no task waits."""
    return floor_workers_run("bench.minimal_floor", url, database, clients=clients,
                             batch=batch, lease_ttl_seconds=lease_ttl_seconds)


if __name__ == "__main__":
    asyncio.run(floor_clients_serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                    float(sys.argv[4]),
                                    FloorStatements(_CLAIM, _RESERVE, _LEASE, _lease_args)))
