"""Fairness end to end: a deep backlog of one tenant does not hold back another tenant."""

from __future__ import annotations

from app.config import SHARD_SLOTS
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, ledger_violations, pools_add, task_get, tasks_add

ALL = frozenset(range(SHARD_SLOTS))


async def test_fair_leases_the_small_tenants_task_in_the_first_pass(db: Database) -> None:
    async with db.transaction() as conn:
        await pools_add(conn, 10, tenants=["big", "small"], capacity=(100_000, 10**6, 0))
        await tasks_add(conn, tenant="big", count=10_000)
        (small,) = await tasks_add(conn, tenant="small")

    # Contrast: in admission order the backlog fills the pass and the small task waits.
    fifo = Reconciler(db, ReconcilerConfig(batch_size=64), owner_id="fifo", slots=ALL)
    first = await fifo.run_once(now=NOW)
    assert first.leased == 64 and small not in first.leased_ids

    fair = Reconciler(db, ReconcilerConfig(batch_size=64, policy="fair"), owner_id="fair",
                      slots=ALL)
    result = await fair.run_once(now=NOW)
    assert small in result.leased_ids
    assert result.leased == 64  # the rest of the pass still serves the backlog
    async with db.connection() as conn:
        assert (await task_get(conn, small))["state"] == "LEASED"
    assert await ledger_violations(db) == []


async def test_fair_orders_by_dominant_share_when_capacity_is_short(db: Database) -> None:
    """With room for only a few tasks, the tenant holding nothing gets served first."""
    async with db.transaction() as conn:
        await pools_add(conn, 1, tenants=["heavy", "light"], capacity=(800, 10**6, 0))
        await tasks_add(conn, tenant="heavy", count=5)
    config = ReconcilerConfig(batch_size=16, policy="fair")
    await Reconciler(db, config, owner_id="warm", slots=ALL).run_once(now=NOW)  # heavy holds 500
    async with db.transaction() as conn:
        heavy_more = await tasks_add(conn, tenant="heavy", count=3)
        light = await tasks_add(conn, tenant="light", count=3)
    result = await Reconciler(db, config, owner_id="r", slots=ALL).run_once(now=NOW)
    # Room for three: all go to the tenant holding nothing, though heavy's are older.
    assert set(result.leased_ids) == set(light)
    async with db.connection() as conn:
        waiting = [await task_get(conn, t) for t in heavy_more]
    assert all(t["pending_reason"]["code"] == "insufficient_cpu" for t in waiting)
