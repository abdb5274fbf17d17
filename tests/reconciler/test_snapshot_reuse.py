"""Passes of one reconciler reuse the pools' static part until a pool changes."""

from __future__ import annotations

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.pools import pool_capacity_put, pool_status_set
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import (
    NOW,
    heartbeat_add,
    ledger_violations,
    pool_add,
    spec_make,
    task_get,
    tasks_add,
)

ALL = frozenset(range(SHARD_SLOTS))


async def test_a_cordon_between_passes_is_honoured(db: Database) -> None:
    async with db.transaction() as conn:
        for pid in ("p1", "p2"):
            await pool_add(conn, pid, tenants=["t1"], capacity=(1000, 1000, 0))
            await heartbeat_add(conn, f"rt-{pid}", at=NOW)
        await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=600))
    rec = Reconciler(db, ReconcilerConfig(), owner_id="test", slots=ALL)
    first = await rec.run_once(now=NOW)
    assert first.leased == 1 and first.snapshot_rebuilt

    async with db.transaction() as conn:
        (second_id,) = await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=300))
    second = await rec.run_once(now=NOW)
    assert second.leased == 1 and not second.snapshot_rebuilt
    async with db.connection() as conn:
        placed_on = (await task_get(conn, second_id))["placement"]["poolId"]

    # Cordon the pool the last task went to: the next pass must not use it.
    async with db.transaction() as conn:
        await pool_status_set(conn, pool_id=placed_on, status="CORDONED", reason=None,
                              drain_deadline=None, now=NOW)
        (third_id,) = await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=100))
    third = await rec.run_once(now=NOW)
    assert third.leased == 1 and third.snapshot_rebuilt
    async with db.connection() as conn:
        assert (await task_get(conn, third_id))["placement"]["poolId"] != placed_on

    # Shrink the other pool to exactly what it holds (700): a task it had room for waits.
    other = "p2" if placed_on == "p1" else "p1"
    async with db.transaction() as conn:
        await pool_capacity_put(conn, pool_id=other, totals=(700, 1000, 0), now=NOW)
        await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=100))
    fourth = await rec.run_once(now=NOW)
    assert (fourth.leased, fourth.pending, fourth.snapshot_rebuilt) == (0, 1, True)
    assert await ledger_violations(db) == []


async def test_what_changed_after_the_read_ahead_reaches_the_first_pass(db: Database) -> None:
    """Pools read ahead: the first pass applies the ledgers written since (another
    reconciler's lease) without reading every pool, and a pool row written since (a cordon)
    makes it read them all again."""
    async with db.transaction() as conn:
        for pid in ("p1", "p2", "p3"):
            await pool_add(conn, pid, tenants=["t1", "t2"], capacity=(1000, 1000, 0))
            await heartbeat_add(conn, f"rt-{pid}", at=NOW)
    rec = Reconciler(db, ReconcilerConfig(), owner_id="ahead", slots=ALL)
    await rec.read_ahead(now=NOW)
    assert rec._snapshot_cache.rebuilds == 1

    # Another reconciler fills p1 after the read ahead.
    async with db.transaction() as conn:
        (big,) = await tasks_add(conn, tenant="t2", count=1, spec=spec_make(cpu=1000))
    other = Reconciler(db, ReconcilerConfig(), owner_id="other", slots=ALL)
    assert (await other.run_once(now=NOW)).leased == 1
    async with db.connection() as conn:
        full = (await task_get(conn, big))["placement"]["poolId"]
    async with db.transaction() as conn:
        (first,) = await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=600))
    result = await rec.run_once(now=NOW)
    assert result.leased == 1 and not result.snapshot_rebuilt
    async with db.connection() as conn:
        went = (await task_get(conn, first))["placement"]["poolId"]
    assert went != full  # the full pool's reservation was seen

    # A cordon written after the next read ahead: the first pass reads every pool again.
    fresh = Reconciler(db, ReconcilerConfig(), owner_id="fresh", slots=ALL)
    await fresh.read_ahead(now=NOW)
    async with db.transaction() as conn:
        await pool_status_set(conn, pool_id=went, status="CORDONED", reason=None,
                              drain_deadline=None, now=NOW)
        (second,) = await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=300))
    result = await fresh.run_once(now=NOW)
    assert result.leased == 1 and result.snapshot_rebuilt
    async with db.connection() as conn:
        assert (await task_get(conn, second))["placement"]["poolId"] not in (went, full)
    assert await ledger_violations(db) == []
