"""A flapping shared runtime does not multiply events: a parked task's reason changes caused by
a pool's health flaps are logged at most once per park sweep period (its pending reason is
always the latest), and the log catches up with the latest reason later."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.claims import ClaimedTask
from app.reconciler import Reconciler, ReconcilerConfig
from app.scheduling.planner import pending_logged
from tests.factories import heartbeat_add, pool_add, spec_make, tasks_add

pytestmark = pytest.mark.slow

ALL = frozenset(range(SHARD_SLOTS))
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
#: As in the report: globex's 20,000 parked tasks on a shared pool.
PARKED = 20_000
PERIOD = 300.0


def _task(pending: str | None, logged: str | None, logged_ago: float | None) -> ClaimedTask:
    at = None if logged_ago is None else T0 - timedelta(seconds=logged_ago)
    return ClaimedTask(uuid.UUID(int=1), "globex", 1, 0, "{}", T0, 0, pending, None, None,
                       logged, at)


@pytest.mark.parametrize(("task", "code", "logged"), [
    (_task(None, None, None), "insufficient_cpu", True),
    (_task(None, "runtime_unhealthy", 1), "insufficient_cpu", True),
    (_task("insufficient_cpu", "insufficient_cpu", 1), "insufficient_cpu", False),
    (_task("insufficient_cpu", "insufficient_cpu", 1), "runtime_unhealthy", False),
    (_task("insufficient_cpu", "insufficient_cpu", PERIOD), "runtime_unhealthy", True),
    (_task("runtime_unhealthy", "insufficient_cpu", 1), "insufficient_cpu", False),
    (_task("insufficient_cpu", "runtime_unhealthy", PERIOD - 1), "insufficient_cpu", False),
    (_task("insufficient_cpu", "runtime_unhealthy", PERIOD + 1), "insufficient_cpu", True),
    (_task("insufficient_cpu", None, None), "insufficient_cpu", False),
    (_task("insufficient_cpu", None, None), "runtime_unhealthy", True),
    (_task("preempting", "preempting", 1), "insufficient_cpu", True),
], ids=["first-examination", "first-after-a-requeue", "same-reason", "changed-too-soon",
        "changed-a-period-later", "back-to-the-logged-reason", "catch-up-too-soon",
        "catch-up", "unrecorded-same", "unrecorded-changed", "a-preemption-ended"])
def test_a_reexamined_tasks_reason_change_is_logged_at_most_once_a_period(
    task: ClaimedTask, code: str, logged: bool
) -> None:
    assert pending_logged(task, code, now=T0, period=PERIOD) is logged


async def _settle(reconciler: Reconciler, now: datetime) -> int:
    """Run passes at ``now`` until one claims nothing; return the tasks claimed."""
    claimed = 0
    while (result := await reconciler.run_once(now=now)).claimed:
        claimed += result.claimed
    return claimed


async def _events(db: Database) -> dict[str, int]:
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT reason, count(*) FROM task_events GROUP BY 1")
    return {r[0]: int(r[1]) for r in rows}


async def _codes(db: Database) -> dict[str, int]:
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT pending_reason ->> 'code', count(*) FROM tasks "
                                "WHERE tenant_id = 'globex' GROUP BY 1")
    return {r[0]: int(r[1]) for r in rows}


async def test_a_heartbeat_gap_with_a_listener_reconnect_writes_one_event_per_task_per_period(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        # Full: globex's tasks wait for capacity on the one pool they may use.
        await pool_add(conn, "shared", tenants=["acme", "globex"], capacity=(1000, 1000, 0),
                       reserved=(1000, 0, 0))
        await heartbeat_add(conn, "rt-shared", at=T0)
        await tasks_add(conn, tenant="globex", count=PARKED, spec=spec_make(cpu=500),
                        admitted_at=T0)
    reconciler = Reconciler(db, ReconcilerConfig(park_sweep_seconds=PERIOD),
                            owner_id="flap", slots=ALL)
    assert await _settle(reconciler, T0) == PARKED
    assert await _events(db) == {"insufficient_cpu": PARKED}

    # Hours later the runtime misses heartbeats for 20 s, and the wakeup listener reconnects
    # meanwhile (every parked task is unparked: a notification may have been missed).
    gap = T0 + timedelta(hours=2)
    async with db.transaction() as conn:
        await heartbeat_add(conn, "rt-shared", at=gap - timedelta(seconds=20))
    assert await reconciler.unpark(now=gap) == PARKED
    assert await _settle(reconciler, gap) == PARKED
    assert await _codes(db) == {"runtime_unhealthy": PARKED}
    # The runtime is back: its pool_healthy wakeup wakes them all again.
    back = gap + timedelta(seconds=1)
    async with db.transaction() as conn:
        await heartbeat_add(conn, "rt-shared", at=back)
    assert await reconciler.unpark(now=back) == PARKED
    assert await _settle(reconciler, back) == PARKED
    # Every task's pending reason is the latest at once...
    assert await _codes(db) == {"insufficient_cpu": PARKED}
    # ... but the flap and the return wrote one event per task, not two.
    events = await _events(db)
    assert sum(events.values()) - PARKED <= PARKED, events

    # Another flap within the period writes nothing more.
    again = back + timedelta(seconds=60)
    async with db.transaction() as conn:
        await heartbeat_add(conn, "rt-shared", at=again - timedelta(seconds=20))
    await reconciler.unpark(now=again)
    await _settle(reconciler, again)
    async with db.transaction() as conn:
        await heartbeat_add(conn, "rt-shared", at=again + timedelta(seconds=1))
    await reconciler.unpark(now=again + timedelta(seconds=1))
    await _settle(reconciler, again + timedelta(seconds=1))
    assert await _events(db) == events

    # A period after the last logged change, the sweep's re-examination catches the log up
    # with the latest reason: each task's last event is its pending reason again.
    sweep = gap + timedelta(seconds=PERIOD)
    async with db.transaction() as conn:
        await heartbeat_add(conn, "rt-shared", at=sweep)
    await reconciler.unpark(now=sweep)
    assert await _settle(reconciler, sweep) == PARKED
    async with db.connection() as conn:
        stale = await conn.fetchval(
            "SELECT count(*) FROM tasks t WHERE t.pending_reason ->> 'code' IS DISTINCT FROM "
            "(SELECT e.reason FROM task_events e WHERE e.task_id = t.id "
            "ORDER BY e.id DESC LIMIT 1)")
    assert stale == 0
    assert sum((await _events(db)).values()) <= 3 * PARKED


async def test_a_task_that_never_finishes_keeps_its_first_event_and_the_latest_ones(
    db: Database,
) -> None:
    keep = 3
    async with db.transaction() as conn:
        await pool_add(conn, "shared", tenants=["globex"], capacity=(1000, 1000, 0),
                       reserved=(1000, 0, 0))
        (task,) = await tasks_add(conn, tenant="globex", spec=spec_make(cpu=500),
                                  admitted_at=T0)
        await conn.execute("INSERT INTO task_events (task_id, at, to_state, reason) "
                           "VALUES ($1, $2, 'ADMITTED', 'submitted')", task, T0)
    reconciler = Reconciler(
        db, ReconcilerConfig(park_sweep_seconds=PERIOD, task_events_kept=keep),
        owner_id="keeper", slots=ALL)
    # Ten periods of a runtime that is down, then up, then down...: one change logged each.
    reasons = []
    for i in range(10):
        at = T0 + timedelta(seconds=PERIOD * i)
        healthy = i % 2 == 1
        async with db.transaction() as conn:
            await heartbeat_add(conn, "rt-shared", at=at if healthy else T0 - timedelta(hours=1))
        await reconciler.unpark(now=at)
        await _settle(reconciler, at)
        reasons.append("insufficient_cpu" if healthy else "runtime_unhealthy")
    async with db.connection() as conn:
        logged = [r[0] for r in await conn.fetch(
            "SELECT reason FROM task_events WHERE task_id = $1 ORDER BY id", task)]
        code = await conn.fetchval(
            "SELECT pending_reason ->> 'code' FROM tasks WHERE id = $1", task)
    assert logged == ["submitted", *reasons[-keep:]]
    assert logged[-1] == code
