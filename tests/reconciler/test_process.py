"""`berth reconcile` as a real process: SIGKILL mid-pass leaks nothing; SIGTERM stops cleanly."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import (
    ledger_violations,
    pools_add,
    reconcile_process,
    spec_make,
    task_states,
    tasks_add,
)

pytestmark = pytest.mark.slow

TASKS = 3000


def _start(database_url: str, *args: str) -> subprocess.Popen:
    return reconcile_process(database_url, *args, batch_size=20, claim_ttl_seconds=30)


async def _setup(db: Database) -> None:
    fresh = datetime.now(UTC) + timedelta(hours=1)  # the process reads the real clock
    async with db.transaction() as conn:
        await pools_add(conn, 20, tenants=["t1", "t2", "t3"], capacity=(1_000_000, 10**7, 0),
                        heartbeat_at=fresh)
        for tenant in ("t1", "t2", "t3"):
            await tasks_add(conn, tenant=tenant, count=TASKS // 3, spec=spec_make(cpu=10))


async def _passes_in_flight(db: Database) -> int:
    """Return how many other sessions hold an open transaction with a transaction id (a
    pass that has claimed: its ``FOR UPDATE`` row locks gave it one)."""
    async with db.connection() as conn:
        return await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL")


async def _mid_pass(db: Database, proc: subprocess.Popen) -> None:
    """Wait until some tasks are leased and a pass holds claims (or the process ended)."""
    for _ in range(20_000):
        states = await task_states(db)
        if states.get("LEASED", 0) and states.get("ADMITTED", 0) and await _passes_in_flight(db):
            return
        if proc.poll() is not None:
            pytest.fail(f"reconciler exited early: {proc.stderr.read().decode()[-2000:]}")
        await asyncio.sleep(0.002)
    pytest.fail("never caught the reconciler mid-pass")


async def test_sigkill_mid_pass_then_another_reconciler_finishes(
    db: Database, database_url: str
) -> None:
    await _setup(db)
    proc = _start(database_url)
    try:
        await _mid_pass(db, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The server ends the dead process's sessions: the pass in flight rolled back whole.
    for _ in range(5000):
        if not await _passes_in_flight(db):
            break
        await asyncio.sleep(0.002)
    assert await _passes_in_flight(db) == 0
    assert set(await task_states(db)) <= {"ADMITTED", "LEASED"}
    assert await ledger_violations(db) == []  # a torn pass leaves nothing half-written

    # Its claims were row locks: another reconciler takes the tasks at once (no expiry).
    finisher = Reconciler(db, ReconcilerConfig(batch_size=500), owner_id="finisher",
                          slots=frozenset(range(SHARD_SLOTS)))
    while (await finisher.run_once(now=datetime.now(UTC))).claimed:
        pass
    assert await task_states(db) == {"LEASED": TASKS}
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT task_id FROM leases GROUP BY task_id "
            "HAVING count(*) > 1) x")
        events = await conn.fetchval(
            "SELECT count(*) FROM (SELECT task_id FROM task_events GROUP BY task_id "
            "HAVING count(*) > 1) x")
        reserved = await conn.fetchval("SELECT SUM(cpu_reserved) FROM ledgers")
    assert twice == 0
    assert events == 0  # one event per task (leased): nothing of the torn pass remains
    assert reserved == TASKS * 10


async def test_sigterm_finishes_the_pass_and_exits_cleanly(
    db: Database, database_url: str
) -> None:
    await _setup(db)
    proc = _start(database_url, "--shard", "0/1")
    try:
        await _mid_pass(db, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    states = await task_states(db)
    assert set(states) <= {"ADMITTED", "LEASED"} and states.get("LEASED")
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        locks = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())")
    assert locks == 0


async def test_a_killed_dynamic_replicas_slots_are_taken_over(
    db: Database, database_url: str
) -> None:
    from app.reconciler.ownership import DynamicOwnership

    survivor = DynamicOwnership(db, owner_id="survivor")
    proc = _start(database_url)  # dynamic ownership: no --shard
    try:
        for _ in range(3000):
            slots = await survivor.refresh()
            if len(slots) == SHARD_SLOTS // 2 and survivor.members == 2:
                break
            if proc.poll() is not None:
                pytest.fail(proc.stderr.read().decode()[-2000:])
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the two replicas never split the slots")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for _ in range(3000):
            if await survivor.refresh() == frozenset(range(SHARD_SLOTS)):
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the survivor never took over the dead replica's slots")
        assert survivor.members == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await survivor.stop()
