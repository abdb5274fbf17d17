"""Race: four reconcilers on their own connection pools, 10,000 tasks, 50 tightly sized pools."""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import REGISTRY

from app.config import SHARD_SLOTS
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, ledger_violations, pools_add, spec_make, task_states, tasks_add

pytestmark = pytest.mark.slow

ALL = frozenset(range(SHARD_SLOTS))
TENANTS = [f"tenant-{i}" for i in range(10)]


async def _drain(reconciler: Reconciler, conflicts: list[int]) -> int:
    """Run passes until two in a row claim nothing; return the tasks leased."""
    leased = idle = 0
    while idle < 2:
        result = await reconciler.run_once(now=NOW)
        leased += result.leased
        conflicts.append(result.conflicts)
        idle = idle + 1 if result.claimed == 0 else 0
    return leased


async def test_four_reconcilers_never_overcommit_lose_or_double_place(
    db: Database, database_url: str
) -> None:
    rng = random.Random(7)
    async with db.transaction() as conn:
        # 50 pools x 10 cpu-cores: room for about half of the demand below.
        await pools_add(conn, 50, tenants=TENANTS, capacity=(10_000, 20_000, 4))
        for tenant in TENANTS:
            specs = [
                spec_make(cpu=rng.choice((100, 200, 300)), memory=rng.choice((100, 400)),
                          llm=1 if rng.random() < 0.01 else 0)
                for _ in range(980)
            ]
            specs += [spec_make(cpu=200, memory=100, gang={"members": 3, "minPools": 2})] * 20
            await tasks_add(conn, tenant=tenant, specs=specs)
        await conn.execute("ANALYZE tasks")

    deadlocks = REGISTRY.get_sample_value("berth_transient_retries_total", {"kind": "deadlock"})
    databases = [Database(database_url, max_size=4) for _ in range(4)]
    try:
        reconcilers = [
            Reconciler(d, ReconcilerConfig(batch_size=200), owner_id=f"racer-{i}", slots=ALL)
            for i, d in enumerate(databases)
        ]
        conflicts: list[int] = []
        leased = await asyncio.gather(*(_drain(r, conflicts) for r in reconcilers))
    finally:
        for d in databases:
            await d.close()

    print(f"reservation conflicts: {sum(conflicts)}")
    # Pool-id lock order: racing commits wait for each other, they never deadlock.
    assert REGISTRY.get_sample_value(
        "berth_transient_retries_total", {"kind": "deadlock"}) == deadlocks
    assert await ledger_violations(db) == []
    states = await task_states(db)
    assert set(states) <= {"LEASED", "ADMITTED"}
    assert states["LEASED"] == sum(leased)
    assert sum(states.values()) == 10_000
    async with db.connection() as conn:
        unexplained = await conn.fetchval(
            "SELECT count(*) FROM tasks WHERE state = 'ADMITTED' "
            "AND (NOT parked OR pending_reason IS NULL)")
        doubled = await conn.fetchval(
            "SELECT count(*) FROM (SELECT task_id FROM leases GROUP BY task_id "
            "HAVING count(*) != count(DISTINCT pool_id)) x")
        gang_members = [r[0] for r in await conn.fetch(
            "SELECT SUM(r.members) FROM reservations r JOIN tasks t ON t.id = r.task_id "
            "WHERE t.spec::jsonb ? 'gang' GROUP BY t.id")]
        used = await conn.fetchval(
            "SELECT SUM(cpu_reserved)::float / SUM(cpu_total) FROM ledgers")
    assert unexplained == 0  # every waiting task says why
    assert doubled == 0  # one lease per pool of a task, one grant per task
    assert gang_members and set(gang_members) == {3}  # all members, never part of a gang
    assert used > 0.95  # tight packing: the pools are (nearly) full
