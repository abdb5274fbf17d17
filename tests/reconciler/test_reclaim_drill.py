"""The reclaim drill: two real ``berth reconcile`` processes and a runtime that releases at
once. Tenant a's stream fills every pool by borrowing tenant b's nominal; then b submits its
nominal's worth. b's tasks lease within the grace period (the capacity is handed over when
the runtime releases, before any deadline), no more than b's need is revoked, nothing is
lost, and the ledger and the quota usage rows match."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from app.db import Database
from app.ledger.invariants import ledger_check
from app.ledger.leases import LeaseStale, lease_complete
from app.ledger.tenants import Quota, tenant_put
from tests.factories import ledger_violations, pools_add, reconcile_process, spec_make, tasks_add

pytestmark = pytest.mark.slow

GRACE = 3
NOMINAL = 4000
#: a's stream: more than the pools hold (the rest waits for quota).
STREAM = 12


def _start(database_url: str) -> subprocess.Popen:
    return reconcile_process(database_url, stdout=subprocess.DEVNULL,
                             preemption_grace_seconds=GRACE, tick_seconds=0.2)


async def _until(db: Database, sql: str, want: object, procs: list[subprocess.Popen],
                 *args: object) -> None:
    """Wait until ``sql`` answers ``want`` (the reconcilers must stay up meanwhile)."""
    for _ in range(600):
        async with db.connection() as conn:
            if await conn.fetchval(sql, *args) == want:
                return
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"a reconciler exited: {p.stderr.read().decode()[-2000:]}")
        await asyncio.sleep(0.05)
    async with db.connection() as conn:
        got = await conn.fetchval(sql, *args)
    pytest.fail(f"{sql!r} answered {got!r}, not {want!r}")


async def _runtime(db: Database, stop: asyncio.Event, released: list) -> None:
    """A runtime that gives back every revoking lease as soon as it sees it."""
    while not stop.is_set():
        async with db.connection() as conn:
            rows = await conn.fetch("SELECT id, epoch, task_id, revoke_by FROM leases "
                                    "WHERE state = 'REVOKING'")
        for lease_id, epoch, task_id, revoke_by in rows:
            async with db.transaction() as conn:
                try:
                    await lease_complete(conn, lease_id=lease_id, epoch=epoch,
                                         outcome="released", message=None,
                                         now=datetime.now(UTC))
                except LeaseStale:
                    continue
            released.append((task_id, revoke_by))
        await asyncio.sleep(0.02)


async def test_reclaim_drill(db: Database, database_url: str) -> None:
    fresh = datetime.now(UTC) + timedelta(hours=1)  # the processes read the real clock
    async with db.transaction() as conn:
        await pools_add(conn, 2, tenants=["a", "b"], capacity=(4000, 8192, 0),
                        heartbeat_at=fresh)
        for name in ("a", "b"):
            await tenant_put(conn, tenant_id=name, cohort="c", fair_weight=1.0,
                             now=datetime.now(UTC),
                             quotas={"standard": {"cpuMillis": Quota(NOMINAL, None, None)}})
        stream = await tasks_add(conn, tenant="a", count=STREAM, spec=spec_make(cpu=1000))
    procs = [_start(database_url) for _ in range(2)]
    stop = asyncio.Event()
    released: list = []
    runtime = asyncio.create_task(_runtime(db, stop, released))
    try:
        # a borrows all of b's nominal: 8 of its tasks on the 8 cores, 4 wait for quota.
        await _until(db, "SELECT count(*) FROM tasks WHERE tenant_id = 'a' "
                     "AND state = 'LEASED'", 8, procs)
        await _until(db, "SELECT count(*) FROM tasks WHERE tenant_id = 'a' AND "
                     "pending_reason ->> 'code' = 'quota_borrow_unavailable'", 4, procs)
        async with db.transaction() as conn:
            mine = await tasks_add(conn, tenant="b", count=NOMINAL // 1000,
                                   spec=spec_make(cpu=1000))
        await _until(db, "SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) "
                     "AND state = 'LEASED'", len(mine), procs, mine)
        # The victims, back in the queue, are looked at again and wait for quota.
        await _until(db, "SELECT count(*) FROM tasks WHERE tenant_id = 'a' AND "
                     "pending_reason ->> 'code' = 'quota_borrow_unavailable'", 8, procs)
    finally:
        stop.set()
        await runtime
        for p in procs:
            p.terminate()
        for p in procs:
            assert p.wait(timeout=30) == 0, p.stderr.read().decode()[-2000:]

    async with db.connection() as conn:
        # No more than b's need was revoked: one lease of a per task of b, each released by
        # the runtime before its deadline (none revoked at a deadline).
        revoked = await conn.fetch(
            "SELECT l.task_id, l.state, l.end_reason, l.preempted_by FROM leases l "
            "WHERE l.revoke_by IS NOT NULL")
        assert len(revoked) == len(mine) == len(released)
        assert {r[1] for r in revoked} == {"COMPLETED"}
        assert {r[0] for r in revoked} <= set(stream)
        assert {r[3] for r in revoked} == set(mine)
        # b's leases were granted before their victims' deadlines: within the grace period.
        deadline = max(revoke_by for _, revoke_by in released)
        granted = await conn.fetch(
            "SELECT granted_at FROM leases WHERE task_id = ANY($1::uuid[])", mine)
        assert len(granted) == len(mine) and all(g[0] < deadline for g in granted)
        # Nothing lost, no attempt used, no task failed.
        states = {(r[0], r[1]): int(r[2]) for r in await conn.fetch(
            "SELECT tenant_id, state, count(*) FROM tasks GROUP BY 1, 2")}
        assert states == {("a", "LEASED"): 4, ("a", "ADMITTED"): 8, ("b", "LEASED"): 4}
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE attempts > 0") == 0
        events = await conn.fetchval(
            "SELECT count(*) FROM task_events WHERE reason = 'reclaimed'")
        assert events == len(mine)
        # The ledger and the usage rows match.
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}
        usage = {r[0]: int(r[1]) for r in await conn.fetch(
            "SELECT tenant_id, used FROM quota_usage WHERE resource = 'cpuMillis'")}
        assert usage == {"a": NOMINAL, "b": NOMINAL}
        assert await conn.fetchval(
            "SELECT coalesce(sum(greatest(0, used - cap)), 0) FROM cohort_usage") == 0
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE hold") == 0
    assert await ledger_violations(db) == []
