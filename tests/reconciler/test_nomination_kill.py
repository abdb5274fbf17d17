"""Nominations under faults: `berth reconcile` killed (SIGKILL) while it nominates and holds
capacity for a starving task leaves no capacity held for nothing, and the ledger sound."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.invariants import ledger_check
from app.ledger.leases import lease_complete, runtime_heartbeat
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import ledger_violations, pool_add, reconcile_process, spec_make, tasks_add

pytestmark = pytest.mark.slow


def _start(database_url: str) -> subprocess.Popen:
    return reconcile_process(database_url, nomination_seconds=1, tick_seconds=0.05)


async def _held_for_nothing(db: Database) -> list:
    """Hold rows of tasks that are not admitted, or that neither a nomination nor a
    preemption explains."""
    async with db.connection() as conn:
        return await conn.fetch(
            "SELECT r.task_id, r.pool_id, r.cpu FROM reservations r "
            "LEFT JOIN tasks t ON t.id = r.task_id WHERE r.hold AND (t.state IS DISTINCT "
            "FROM 'ADMITTED' OR NOT EXISTS (SELECT 1 FROM nominations n "
            "WHERE n.task_id = r.task_id AND n.pool_id = r.pool_id))")


async def _wait_for(db: Database, sql: str, proc: subprocess.Popen, *args: object) -> None:
    for _ in range(5000):
        async with db.connection() as conn:
            if await conn.fetchval(sql, *args):
                return
        if proc.poll() is not None:
            pytest.fail(f"reconciler exited early: {proc.stderr.read().decode()[-2000:]}")
        await asyncio.sleep(0.004)
    pytest.fail(f"never saw: {sql}")


async def _nominated(db: Database, big: uuid.UUID, proc: subprocess.Popen) -> None:
    """Let leases end (each wakes the big task) until it has not fit for a second and the
    process nominates it."""
    for _ in range(200):
        async with db.connection() as conn:
            if await conn.fetchval("SELECT count(*) FROM nominations WHERE task_id = $1", big):
                return
        if proc.poll() is not None:
            pytest.fail(f"reconciler exited early: {proc.stderr.read().decode()[-2000:]}")
        await _complete_one(db, datetime.now(UTC))
        await asyncio.sleep(0.25)
    pytest.fail("the big task was never nominated")


async def _complete_one(db: Database, now: datetime) -> bool:
    async with db.transaction() as conn:
        row = await conn.fetchrow(
            "SELECT l.id, l.epoch FROM leases l JOIN tasks t ON t.id = l.task_id "
            "WHERE l.state = 'ACTIVE' AND t.spec::jsonb -> 'requests' ->> 'cpuMillis' = '1000' "
            "ORDER BY l.granted_at LIMIT 1")
        if row is None:
            return False
        await lease_complete(conn, lease_id=row[0], epoch=row[1], outcome="succeeded",
                             message=None, now=now)
        return True


async def test_sigkill_while_nominating_leaves_no_capacity_held_for_nothing(
    db: Database, database_url: str
) -> None:
    now = datetime.now(UTC)
    fresh = now + timedelta(hours=1)  # the process reads the real clock
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(4000, 65536, 0))
        await runtime_heartbeat(conn, instance_id="rt-p1", now=fresh, lease_ttl_seconds=7200)
        await tasks_add(conn, tenant="t1", count=4, spec=spec_make(cpu=1000),
                        admitted_at=now - timedelta(hours=1))
        (big,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=4000),
                                 admitted_at=now - timedelta(hours=1))
        await tasks_add(conn, tenant="t1", count=20, spec=spec_make(cpu=1000))
    # Each round: a fresh process nominates (or finds the nomination), one small lease ends
    # (its capacity goes into the nominee's hold; the last completes the hold, and the
    # process places the nominee), and the process is killed a moment later.
    for round_, delay in enumerate((0.0, 0.004, 0.012, 0.0, 0.002)):
        proc = _start(database_url)
        try:
            if not round_:
                await _nominated(db, big, proc)
            await _complete_one(db, datetime.now(UTC))
            await asyncio.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for _ in range(5000):
            async with db.connection() as conn:
                if not await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL"):
                    break
            await asyncio.sleep(0.002)
        assert await ledger_violations(db) == [], round_
        assert await _held_for_nothing(db) == [], round_
        async with db.connection() as conn:
            assert all(v == 0 for v in (await ledger_check(conn)).values()), round_

    # Another reconciler finishes: the stream's leases end, the nominee gets its capacity.
    finisher = Reconciler(db, ReconcilerConfig(nomination_seconds=1), owner_id="finisher",
                          slots=frozenset(range(SHARD_SLOTS)))
    at = datetime.now(UTC)
    for _ in range(40):
        await finisher.unpark(now=at)
        await finisher.run_once(now=at)
        await finisher.recover_once(now=at)
        async with db.connection() as conn:
            if await conn.fetchval("SELECT state FROM tasks WHERE id = $1", big) != "ADMITTED":
                break
        await _complete_one(db, at)
        at += timedelta(seconds=1)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT state FROM tasks WHERE id = $1", big) == "LEASED"
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE hold") == 0
        assert await conn.fetchval("SELECT count(*) FROM nominations") == 0
    assert await ledger_violations(db) == []


async def test_recovery_releases_a_hold_whose_task_is_gone(db: Database) -> None:
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(4000, 65536, 0))
        gone = uuid.uuid4()
        await conn.execute(
            "INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm, hold) "
            "VALUES ($1, 'p1', 1, 3000, 0, 0, true)", gone)
        await conn.execute("UPDATE ledgers SET cpu_reserved = 3000 WHERE pool_id = 'p1'")
        await conn.execute(
            "INSERT INTO nominations (pool_id, task_id, runtime_class, members, cpu, memory, "
            "llm) VALUES ('p1', $1, 'standard', 1, 4000, 0, 0)", gone)
    rec = Reconciler(db, ReconcilerConfig(nomination_seconds=1), owner_id="r",
                     slots=frozenset(range(SHARD_SLOTS)))
    await rec.recover_once(now=now)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM reservations") == 0
        assert await conn.fetchval("SELECT cpu_reserved FROM ledgers WHERE pool_id = 'p1'") == 0
        assert await conn.fetchval("SELECT count(*) FROM nominations") == 0
    assert await ledger_violations(db) == []
