"""Parking: a task that fits nowhere waits for what could help it, and its history grows with
changes, not with time (SPEC §5)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

from app.config import SHARD_SLOTS, Settings
from app.db import Database
from app.ledger.leases import lease_complete
from app.ledger.pools import pool_capacity_put
from app.metrics import TASKS_CLAIMED, TASKS_PARKED, TASKS_PENDING, WAKEUPS
from app.reconciler import Reconciler, ReconcilerConfig
from app.reconciler.loop import PENDING_LABELS
from tests.factories import ledger_violations, pool_add, spec_make, task_get, tasks_add

pytestmark = pytest.mark.slow

ALL = frozenset(range(SHARD_SLOTS))
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _count(source: str) -> float:
    return WAKEUPS.labels(source=source)._value.get()


async def _until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"gave up waiting until {what}")


async def _events(db: Database, task_id) -> list[tuple[str, str, str]]:
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT from_state, to_state, reason FROM task_events WHERE task_id = $1 "
            "ORDER BY id", task_id)
    return [tuple(r) for r in rows]


async def _heartbeat(db: Database, *instances: str) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO runtime_instances (id, last_heartbeat_at) SELECT i, $2 "
            "FROM unnest($1::text[]) i ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = $2",
            list(instances), datetime.now(UTC) + timedelta(hours=1))


async def test_a_task_no_pool_can_take_writes_two_events_in_20s_then_one_wakeup_places_it(
    db: Database,
) -> None:
    # Default settings: the tick (5 s) runs passes; the sweep (minutes) does not come.
    config = ReconcilerConfig.from_settings(Settings())
    assert config.park_sweep_seconds * 0.75 > 60
    async with db.transaction() as conn:
        await pool_add(conn, "small", tenants=["t1"], capacity=(1000, 1000, 0))
        (task,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=2000))
    await _heartbeat(db, "rt-small")
    reconciler = Reconciler(db, config, owner_id="parker", slots=ALL)
    claimed_before = TASKS_CLAIMED._value.get()
    stop = asyncio.Event()
    loop = asyncio.create_task(reconciler.run(stop))
    try:
        await asyncio.sleep(20)
        history = await _events(db, task)
        assert history == [  # (the factory inserts tasks without their submission event)
            ("ADMITTED", "ADMITTED", "never_fits"),  # a claim writes no event
        ]
        async with db.connection() as conn:
            row = await task_get(conn, task)
        assert row["parked"] and row["attempts"] == 0
        assert row["pending_reason"]["message"] == (
            "never fits, no pool is large enough; 0/1 pool fits: 1 has less cpu in total than "
            "it requests (closest)")
        assert TASKS_CLAIMED._value.get() - claimed_before == 1
        assert len(reconciler.results) >= 3  # the tick ran passes; none claimed it again
        sweeps = _count("sweep")

        # Capacity is added for it: the ledger_raised wakeup alone places it.
        async with db.transaction() as conn:
            await pool_capacity_put(conn, pool_id="small", totals=(4000, 1000, 0),
                                    now=datetime.now(UTC))
        started = time.monotonic()

        async def leased() -> bool:
            async with db.connection() as conn:
                return (await task_get(conn, task))["state"] == "LEASED"

        await _until(leased, "the task is leased after the capacity was raised", seconds=4)
        assert time.monotonic() - started < 4  # not the tick's 5 s, not the sweep's minutes
        assert _count("sweep") == sweeps
    finally:
        stop.set()
        await loop
    assert (await _events(db, task))[-1] == ("ADMITTED", "LEASED", "leased")
    assert await ledger_violations(db) == []


async def test_capacity_released_wakes_only_the_tasks_it_could_help(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(2000, 1000, 0))
        await pool_add(conn, "p2", tenants=["t1"], capacity=(2000, 1000, 0))
        (big,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=2000))
    await _heartbeat(db, "rt-p1", "rt-p2")
    config = ReconcilerConfig(tick_seconds=3600, recovery_seconds=3600,
                              park_sweep_seconds=3600)
    reconciler = Reconciler(db, config, owner_id="selective", slots=ALL)
    stop = asyncio.Event()
    loop = asyncio.create_task(reconciler.run(stop))

    async def state(task_id) -> dict:
        async with db.connection() as conn:
            return await task_get(conn, task_id)

    try:
        await _until(lambda: _leased(db, big), "the first big task is leased")
        async with db.transaction() as conn:
            (filler,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=2000))
            waiting = await tasks_add(conn, tenant="t1", count=2, spec=spec_make(cpu=2000))
            (other_class,) = await tasks_add(
                conn, tenant="t1", spec=spec_make(cpu=100, runtime_class="gpu"))
            (too_big,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=9000))
            await conn.execute("SELECT pg_notify('berth_wakeup', 'submitted')")

        async def settled() -> bool:
            rows = [await state(t) for t in (*waiting, other_class, too_big)]
            return await _leased(db, filler) and all(r["parked"] for r in rows)

        await _until(settled, "the filler is leased and the others are parked")
        assert (await state(waiting[0]))["wake"] == ["class:standard", "pool:p1", "pool:p2"]
        assert (await state(other_class))["wake"] == ["class:gpu"]
        assert (await state(too_big))["wake"] == ["class:standard"]
        before = {t: await _events(db, t) for t in (other_class, too_big)}

        async with db.transaction() as conn:
            lease_id, epoch = await conn.fetchrow(
                "SELECT id, epoch FROM leases WHERE task_id = $1", big)
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="succeeded",
                                 message=None, now=datetime.now(UTC), instance_ids=None)
        await _until(lambda: _leased(db, waiting[0]), "a waiting task takes the capacity")
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await loop
    # The other waiting task was woken too (same pools) and parked again silently; tasks
    # the release could not help were never woken: same state, same history.
    second = await state(waiting[1])
    assert second["parked"] and second["pending_reason"]["code"] == "insufficient_cpu"
    assert [e[2] for e in await _events(db, waiting[1])] == ["insufficient_cpu"]
    for task_id, history in before.items():
        assert (await state(task_id))["parked"]
        assert await _events(db, task_id) == history
    assert sum(r.reexamined for r in reconciler.results) == 2  # waiting[0] and waiting[1]
    assert await ledger_violations(db) == []


async def _leased(db: Database, task_id) -> bool:
    async with db.connection() as conn:
        return (await task_get(conn, task_id))["state"] == "LEASED"


async def test_a_changed_reason_appends_one_event_and_the_sweep_re_examines_silently(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        (task,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=2000))
    reconciler = Reconciler(db, ReconcilerConfig(), owner_id="sweeper", slots=ALL)
    # No heartbeat yet: the pool is unhealthy.
    await reconciler.run_once(now=NOW)
    # The sweep (an unpark of everything) re-examines: same reason, no event.
    assert await reconciler.unpark(now=NOW) == 1
    result = await reconciler.run_once(now=NOW)
    assert (result.reexamined, result.unchanged) == (1, 1)
    assert [e[2] for e in await _events(db, task)] == ["runtime_unhealthy"]
    # Healthy a sweep period later: re-examined again, the reason changed: one event, the
    # change (within a period of the last logged change it would wait, see test_flap.py).
    later = NOW + timedelta(seconds=reconciler.config.park_sweep_seconds)
    async with db.connection() as conn:
        await conn.execute("INSERT INTO runtime_instances (id, last_heartbeat_at) "
                           "VALUES ('rt-p1', $1)", later)
    assert await reconciler.unpark(now=later) == 1
    result = await reconciler.run_once(now=later)
    assert (result.reexamined, result.unchanged) == (1, 0)
    assert await _events(db, task) == [
        ("ADMITTED", "ADMITTED", "runtime_unhealthy"),
        ("ADMITTED", "ADMITTED", "never_fits"),
    ]
    async with db.connection() as conn:
        row = await task_get(conn, task)
    # 2000m on a pool of 1000m: it can never fit, and competes for no capacity (stage 3).
    assert row["attempts"] == 0 and row["pending_stage"] == 3
    # The gauges count waiting tasks by their headline code (fixed labels only).
    await reconciler.queue_gauges_refresh()
    assert TASKS_PENDING.labels(reason="never_fits")._value.get() == 1
    assert TASKS_PENDING.labels(reason="runtime_unhealthy")._value.get() == 0
    assert TASKS_PARKED._value.get() == 1
    assert {s.labels["reason"] for s in TASKS_PENDING.collect()[0].samples} == set(
        PENDING_LABELS)


async def test_a_placement_unparks_the_tasks_waiting_for_an_affinity_match(
    db: Database,
) -> None:
    follow = {"required": [{"selector": {"app": "db"}, "topology": "pool"}]}
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"])
        await conn.execute("INSERT INTO runtime_instances (id, last_heartbeat_at) "
                           "VALUES ('rt-p1', $1)", NOW)
        (follower,) = await tasks_add(
            conn, tenant="t1", spec=spec_make(labels={"app": "web"}, affinity=follow))
    reconciler = Reconciler(db, ReconcilerConfig(), owner_id="aff", slots=ALL)
    await reconciler.run_once(now=NOW)
    async with db.connection() as conn:
        row = await task_get(conn, follower)
    assert row["parked"] and row["pending_reason"]["code"] == "affinity_unsatisfied"
    assert "placed:t1" in row["wake"]
    async with db.transaction() as conn:
        await tasks_add(conn, tenant="t1", spec=spec_make(labels={"app": "db"}))
    result = await reconciler.run_once(now=NOW)
    assert (result.leased, result.woken) == (1, 1)
    result = await reconciler.run_once(now=NOW)
    assert result.leased_ids == [follower]
