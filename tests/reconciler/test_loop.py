"""The loop: LISTEN/NOTIFY wakeups without the tick, and shard handover between replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

import app.reconciler.loop as loop_module
from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.leases import lease_complete
from app.ledger.wakeups import WakeSource, wakeup_notify
from app.metrics import WAKEUPS
from app.reconciler import Reconciler, ReconcilerConfig
from app.shards import shard_of
from tests.factories import (
    heartbeat_add,
    ledger_violations,
    pool_add,
    pools_add,
    rival_clock,
    spec_make,
    task_get,
    tasks_add,
)

pytestmark = pytest.mark.slow

ALL = frozenset(range(SHARD_SLOTS))
QUIET = {"tick_seconds": 3600.0, "recovery_seconds": 3600.0}


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(1500):
        if await check():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"gave up waiting until {what}")


def _count(source: str) -> float:
    return WAKEUPS.labels(source=source)._value.get()


async def _state(db: Database, task_id) -> dict:
    async with db.connection() as conn:
        return await task_get(conn, task_id)


async def test_capacity_release_wakes_a_pending_task_without_the_tick(db: Database) -> None:
    fresh = datetime.now(UTC) + timedelta(hours=1)
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await conn.execute(
            "INSERT INTO runtime_instances (id, last_heartbeat_at) VALUES ('rt-p1', $1)", fresh)
        first, second = await tasks_add(conn, tenant="t1", count=2, spec=spec_make(cpu=1000))
    reconciler = Reconciler(db, ReconcilerConfig(**QUIET), owner_id="waker", slots=ALL)
    stop = asyncio.Event()
    loop = asyncio.create_task(reconciler.run(stop))
    try:
        async def parked() -> bool:
            return (await _state(db, second))["parked"]

        await _until(parked, "the second task is parked for capacity")
        assert (await _state(db, first))["state"] == "LEASED"
        ticks = _count("tick")
        released = _count("capacity_released")
        passes_before = len(reconciler.results) and reconciler.results[-1].pass_id

        async with db.transaction() as conn:
            lease_id, epoch = await conn.fetchrow(
                "SELECT id, epoch FROM leases WHERE task_id = $1", first)
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="succeeded",
                                 message=None, now=datetime.now(UTC), instance_ids=None)

        async def leased() -> bool:
            return (await _state(db, second))["state"] == "LEASED"

        await _until(leased, "the pending task is leased")
    finally:
        stop.set()
        await loop
    assert _count("tick") == ticks  # no tick fired: the notification did it
    assert _count("capacity_released") == released + 1
    after = [r for r in reconciler.results if r.pass_id > passes_before]
    assert second in after[0].leased_ids  # the first pass after the wakeup leased it
    assert await ledger_violations(db) == []


async def test_submission_notify_triggers_a_pass(db: Database) -> None:
    """A submission's notification triggers a pass; the reconciler read the pools before it
    listened, so that pass reads only what changed since."""
    fresh = datetime.now(UTC) + timedelta(hours=1)
    async with db.transaction() as conn:
        await pools_add(conn, 2, tenants=["t1"], heartbeat_at=fresh)
    reconciler = Reconciler(db, ReconcilerConfig(**QUIET), owner_id="sub", slots=ALL)
    stop = asyncio.Event()
    loop = asyncio.create_task(reconciler.run(stop))
    try:
        await _until(lambda: _listening(db), "the reconciler listens")
        assert reconciler._snapshot_cache.snapshot is not None
        async with db.transaction() as conn:
            (task_id,) = await tasks_add(conn, tenant="t1")
            await wakeup_notify(conn, source=WakeSource.SUBMITTED)

        async def leased() -> bool:
            return (await _state(db, task_id))["state"] == "LEASED"

        await _until(leased, "the submitted task is leased")
    finally:
        stop.set()
        await loop
    placing = [r for r in reconciler.results if r.claimed]
    assert placing[0].leased == 1 and not placing[0].snapshot_rebuilt


async def test_a_read_ahead_that_fails_leaves_the_read_to_the_first_pass(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def refused(*args: object, **kwargs: object) -> None:
        raise ConnectionResetError("the server went away")

    monkeypatch.setattr(loop_module, "snapshot_ahead", refused)
    fresh = datetime.now(UTC) + timedelta(hours=1)
    async with db.transaction() as conn:
        await pools_add(conn, 2, tenants=["t1"], heartbeat_at=fresh)
        (task_id,) = await tasks_add(conn, tenant="t1")
    reconciler = Reconciler(db, ReconcilerConfig(**QUIET), owner_id="behind", slots=ALL)
    stop = asyncio.Event()
    loop = asyncio.create_task(reconciler.run(stop))
    try:
        async def leased() -> bool:
            return (await _state(db, task_id))["state"] == "LEASED"

        await _until(leased, "the task is leased")
    finally:
        stop.set()
        await loop
    assert "pools not read ahead" in caplog.text
    placing = [r for r in reconciler.results if r.claimed]
    assert placing[0].leased == 1 and placing[0].snapshot_rebuilt


async def test_a_pass_that_hands_back_lost_races_is_followed_at_once(
    db: Database, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = datetime.now(UTC) + timedelta(hours=1)
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(2000, 1000, 0))
        await pool_add(conn, "p2", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=fresh)
        await heartbeat_add(conn, "rt-p2", at=fresh)
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=500))
    # The first pass ranks p1 first; an operator shrinks p1 between its snapshot and its
    # commit (the pass's commit time is the clock's second read), so its reservation loses
    # and, with no walk allowed, the task goes back to the queue unparked. Nothing notifies,
    # and the tick and every chore are an hour away: only the loop itself can pass again.
    clock = rival_clock(database_url, "UPDATE ledgers SET cpu_total = 300 WHERE pool_id = 'p1'",
                        on_read=2, now=lambda: datetime.now(UTC))
    monkeypatch.setattr(loop_module, "_utcnow", clock)
    monkeypatch.setattr(loop_module, "QUEUE_GAUGES_SECONDS", 3600.0)
    config = ReconcilerConfig(**QUIET, rebalance_seconds=3600.0, reservation_walk_limit=0)
    reconciler = Reconciler(db, config, owner_id="racer", slots=ALL)
    stop = asyncio.Event()
    loop = asyncio.create_task(reconciler.run(stop))
    try:
        async def leased() -> bool:
            return (await _state(db, task_id))["state"] == "LEASED"

        await _until(leased, "the handed-back task is leased")
    finally:
        stop.set()
        await loop
    first, second = list(reconciler.results)[:2]
    assert (first.claimed, first.leased, first.requeued) == (1, 0, 1)
    assert second.leased_ids == [task_id]
    async with db.connection() as conn:
        assert (await task_get(conn, task_id))["placement"]["poolId"] == "p2"
    assert await ledger_violations(db) == []


async def _listening(db: Database) -> bool:
    async with db.connection() as conn:
        return bool(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'berth-listen' "
            "AND datname = current_database()"))


async def test_two_dynamic_replicas_split_the_slots_and_one_takes_over(db: Database) -> None:
    fresh = datetime.now(UTC) + timedelta(hours=1)
    tenants = [f"tenant-{i}" for i in range(12)]
    async with db.transaction() as conn:
        await pools_add(conn, 4, tenants=tenants, heartbeat_at=fresh)
    config = ReconcilerConfig(rebalance_seconds=0.05, **QUIET)
    a = Reconciler(db, config, owner_id="a")
    b = Reconciler(db, config, owner_id="b")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    run_a = asyncio.create_task(a.run(stop_a))
    run_b = asyncio.create_task(b.run(stop_b))
    try:
        async def split() -> bool:
            return (a.slots | b.slots == ALL and not a.slots & b.slots
                    and len(a.slots) == len(b.slots) == SHARD_SLOTS // 2)

        await _until(split, "the replicas split the slots evenly")
        a_share = a.slots
        async with db.transaction() as conn:
            for t in tenants:
                await tasks_add(conn, tenant=t, count=3)
            await wakeup_notify(conn, source=WakeSource.SUBMITTED)
        await _until(lambda: _all_leased(db), "every task is leased by its shard owner")
        stop_a.set()
        await run_a
        await _until(lambda: _true(b.slots == ALL), "the survivor owns every slot")
        orphan = next(t for t in tenants if shard_of(t) in a_share)
        async with db.transaction() as conn:
            (late,) = await tasks_add(conn, tenant=orphan)
            await wakeup_notify(conn, source=WakeSource.SUBMITTED)

        async def late_leased() -> bool:
            return (await _state(db, late))["state"] == "LEASED"

        await _until(late_leased, "a task of a taken-over slot is leased")
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(run_a, run_b)
    assert await ledger_violations(db) == []


async def _true(value: bool) -> bool:
    return value


async def _all_leased(db: Database) -> bool:
    async with db.connection() as conn:
        return not await conn.fetchval("SELECT count(*) FROM tasks WHERE state != 'LEASED'")


async def test_app_lifespan_runs_and_stops_the_in_process_reconciler(db: Database) -> None:
    from app.config import Settings
    from app.main import create_app
    from app.reconciler.process import reconciler_background

    fresh = datetime.now(UTC) + timedelta(hours=1)
    async with db.transaction() as conn:
        await pools_add(conn, 1, tenants=["t1"], heartbeat_at=fresh)
        (task_id,) = await tasks_add(conn, tenant="t1")
    settings = Settings(reconciler_enabled=True, tick_seconds=3600)
    app = create_app(settings, db=db, background=[reconciler_background(settings)])
    async with app.router.lifespan_context(app):
        async def leased() -> bool:
            return (await _state(db, task_id))["state"] == "LEASED"

        await _until(leased, "the in-process reconciler leases the task")
    assert not await _listening(db)  # stopped with the app: its LISTEN connection is gone

    off = create_app(Settings(reconciler_enabled=False), db=db)  # composed without one
    async with db.transaction() as conn:
        (idle,) = await tasks_add(conn, tenant="t1")
        await wakeup_notify(conn, source=WakeSource.SUBMITTED)
    async with off.router.lifespan_context(off):
        assert not await _listening(db)
    assert (await _state(db, idle))["state"] == "ADMITTED"
