"""The reads of a pass and the queue counts have plans that never read finished tasks.

With sequential scans priced out, each statement must still find an index path that covers
only live rows (queued, claimed, leased, live reservations), and pick it over one that reads
the tenants' history (5,000 finished tasks here): a plan that scans ``tasks`` or walks
``ix_tasks_tenant_seq`` (every task a tenant ever had) grows with history
(``berth bench e2e --finished 1000000`` shows a pass's phases with a million finished tasks).

A pool's reservations are read through indexes too (revision 0010_pg, decision 9): its live
leases by ``ix_leases_pool_live``, their reservations by the primary key, its holds by
``ix_reservations_pool_hold`` (reservations are no longer indexed by pool as a whole).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger import claims, pools, preemption, queue, snapshot
from app.ledger.tasks import uuid7_prefix
from app.scheduling.records import Grant

SLOTS = list(range(SHARD_SLOTS))
TENANTS = ["t1", "t2"]

STATEMENTS = {
    "queue gauges (pending by code)": (queue._BY_CODE, [SLOTS]),
    "pending counts, all tenants": (queue._PENDING, [None, None]),
    "pending counts of tenants": (queue._PENDING, [TENANTS, None]),
    "placements for affinity (grouped)": (snapshot._PLACED_GROUPED, [TENANTS]),
    "placements for affinity": (snapshot._PLACED, [TENANTS, None]),
    "placements staying while a pool drains": (snapshot._PLACED, [TENANTS, "pool-x"]),
    "tenant usage (fair policy)": (snapshot._TENANT_USAGE, [TENANTS]),
    "preemption victims": (preemption._VICTIMS, [TENANTS, [5, 5]]),
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
async def test_no_plan_reads_history(db: Database, name: str) -> None:
    sql, args = STATEMENTS[name]
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, state, runtime_class, spec, finished_at) "
            "SELECT gen_random_uuid(), ($1::text[])[1 + g % 2], 0, 'SUCCEEDED', 'standard', "
            "'{}', now() FROM generate_series(1, 5000) AS g", TENANTS,
        )
        await conn.execute("ANALYZE tasks")
        plan = await _plan(conn, sql, args)
    assert "Seq Scan on tasks" not in plan, plan
    assert "ix_tasks_tenant_seq" not in plan, plan


async def _plan(conn, sql: str, args: list) -> str:  # type: ignore[no-untyped-def]
    """Return the plan of ``sql`` with sequential scans priced out."""
    await conn.execute("SET LOCAL enable_seqscan = off")
    return "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args))


POOL_STATEMENTS = {
    "reservations of a pool (delete)": (pools._RESERVATIONS, ["p1"]),
    "tenant usage of pools (pool views)": (pools._TENANT_USAGE, [["p1", "p2"], ["t1"]]),
}


@pytest.mark.parametrize("name", sorted(POOL_STATEMENTS))
async def test_pool_reservations_use_indexes(db: Database, name: str) -> None:
    sql, args = POOL_STATEMENTS[name]
    async with db.transaction() as conn:
        # 2,000 live leases with their reservations on 100 pools (no foreign keys to fill).
        await conn.execute(
            "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, expires_at) "
            "SELECT gen_random_uuid(), gen_random_uuid(), 'p' || (g % 100), 'rt', 1, now() "
            "FROM generate_series(1, 2000) AS g"
        )
        await conn.execute(
            "INSERT INTO reservations (task_id, pool_id, cpu, memory, llm) "
            "SELECT task_id, pool_id, 1, 1, 0 FROM leases"
        )
        await conn.execute("ANALYZE leases")
        await conn.execute("ANALYZE reservations")
        plan = await _plan(conn, sql, args)
    assert "Seq Scan" not in plan, plan
    for index in ("ix_leases_pool_live", "pk_reservations", "ix_reservations_pool_hold"):
        assert index in plan, plan


async def test_lease_reaches_tasks_by_key(db: Database) -> None:
    """The lease statement updates its tasks through ``pk_tasks``, at the planner's own
    prices, never by a scan of every task kept (20,000 finished ones here)."""
    ids = [uuid.uuid4() for _ in range(1000)]
    grants = [Grant(t, "[2]", (("p1", 1, "rt"),), (1, 1, 0)) for t in ids]
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, state, runtime_class, spec, finished_at) "
            "SELECT gen_random_uuid(), 't1', 0, 'SUCCEEDED', 'standard', '{}', now() "
            "FROM generate_series(1, 20000)"
        )
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, runtime_class, spec) "
            "SELECT id, 't1', 0, 'standard', '{}' FROM unnest($1::uuid[]) AS id", ids
        )
        await conn.execute("ANALYZE tasks")
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN " + claims._LEASE, now, now, *claims._lease_args(grants),
            uuid7_prefix(now),
        ))
    assert "Seq Scan on tasks" not in plan, plan
    assert "pk_tasks" in plan, plan
