"""Weighted fair sharing, end to end: two real ``berth reconcile`` processes and a runtime that
gives back revoked leases at once. Tenants a (weight 1) and b (weight 3) of one cohort
have no nominal of their own: they borrow what an idle tenant of the cohort lends, on
pools smaller than that. Both have more equal tasks than the pools hold. a comes first
and takes every pool; then b's tasks reclaim their fair share. Borrowed usage converges
to 1:3 and stays there, every revocation is one of a's leases (b's never, so nothing goes
back and forth), and the ledger and the quota rows match."""

from __future__ import annotations

import asyncio
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest

from app.db import Database
from app.ledger.invariants import ledger_check
from app.ledger.tenants import Quota, tenant_put
from tests.factories import (
    ledger_violations,
    pools_add,
    processes_stop,
    reconcile_process,
    spec_make,
    tasks_add,
)
from tests.reconciler.test_reclaim_drill import _runtime

pytestmark = pytest.mark.slow

#: 2 pools of 4 cores: 8 tasks of 1 core run at once; the fair split is 2 (a) to 6 (b).
POOLS, CORES = 2, 4000
#: Each tenant's backlog: more than the pools hold, so demand never runs out.
BACKLOG = 16
WANT = {"a": 2000, "b": 6000}

_BORROWED = (
    "SELECT tenant_id, used FROM quota_usage WHERE resource = 'cpuMillis' "
    "AND tenant_id IN ('a', 'b')"
)


async def _borrowed(db: Database) -> dict[str, int]:
    async with db.connection() as conn:
        return {r[0]: int(r[1]) for r in await conn.fetch(_BORROWED)}


def _alive(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is not None:
            pytest.fail(f"a reconciler exited: {p.stderr.read().decode()[-2000:]}")


def _near(got: dict[str, int]) -> bool:
    """Return whether a:b is 1:3 within 10 %, with every core used."""
    a, b = got.get("a", 0), got.get("b", 0)
    return b > 0 and a + b == POOLS * CORES and abs(a / b - 1 / 3) <= 0.1 / 3


async def _converged(db: Database, procs: list[subprocess.Popen], *, within: float) -> None:
    """Wait (at most ``within`` seconds) until the split is 1:3 (±10 %)."""
    deadline = time.monotonic() + within
    got: dict[str, int] = {}
    while time.monotonic() < deadline:
        got = await _borrowed(db)
        if _near(got):
            return
        _alive(procs)
        await asyncio.sleep(0.1)
    pytest.fail(f"borrowed usage did not reach 1:3 in {within}s: {got}")


async def test_borrowed_capacity_converges_to_weights(db: Database, database_url: str) -> None:
    fresh = datetime.now(UTC) + timedelta(hours=1)  # the processes read the real clock
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await pools_add(conn, POOLS, tenants=["a", "b", "lender"], capacity=(CORES, 8192, 0),
                        heartbeat_at=fresh)
        await tenant_put(conn, tenant_id="lender", cohort="c", fair_weight=1.0, now=now,
                         quotas={"standard": {"cpuMillis": Quota(100_000)}})
        for name, weight in (("a", 1.0), ("b", 3.0)):
            await tenant_put(conn, tenant_id=name, cohort="c", fair_weight=weight, now=now,
                             quotas={"standard": {"cpuMillis": Quota(0)}})
        await tasks_add(conn, tenant="a", count=BACKLOG, spec=spec_make(cpu=1000))
    procs = [reconcile_process(database_url, stdout=subprocess.DEVNULL,
                               preemption_grace_seconds=3, tick_seconds=0.2)
             for _ in range(2)]
    stop = asyncio.Event()
    released: list = []
    runtime = asyncio.create_task(_runtime(db, stop, released))
    samples: list[dict[str, int]] = []
    try:
        # a alone takes every core.
        deadline = time.monotonic() + 30
        while (await _borrowed(db)).get("a", 0) < POOLS * CORES:
            _alive(procs)
            assert time.monotonic() < deadline, await _borrowed(db)
            await asyncio.sleep(0.1)
        async with db.transaction() as conn:
            await tasks_add(conn, tenant="b", count=BACKLOG, spec=spec_make(cpu=1000))
        await _converged(db, procs, within=60)
        # ... and stays there while both keep waiting with more than the pools hold.
        for _ in range(40):
            samples.append(await _borrowed(db))
            _alive(procs)
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await runtime
        processes_stop(procs)
    for p in procs:
        assert p.returncode == 0, p.stderr.read().decode()[-2000:]

    assert all(s == WANT for s in samples), samples
    async with db.connection() as conn:
        revoked = await conn.fetch(
            "SELECT t.tenant_id, l.preempted_by FROM leases l JOIN tasks t ON t.id = l.task_id "
            "WHERE l.revoke_by IS NOT NULL")
        by = {r[0]: int(r[1]) for r in await conn.fetch(
            "SELECT tenant_id, count(*) FROM tasks WHERE id = ANY($1::uuid[]) GROUP BY 1",
            [r[1] for r in revoked])}
        # Only a's leases were taken, by b's tasks, and no more than b's fair share: what
        # went to b never came back.
        assert {r[0] for r in revoked} == {"a"}
        assert by == {"b": len(revoked)}
        assert len(revoked) == WANT["b"] // 1000
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE attempts > 0") == 0
        # A waiting task says it waits for its fair share, with its share.
        waiting = await conn.fetch(
            "SELECT tenant_id, pending_reason FROM tasks WHERE state = 'ADMITTED' "
            "AND pending_reason ->> 'message' LIKE '%waits for its fair share%'")
        assert {r[0] for r in waiting} == {"a", "b"}
        assert all(r[1]["fairShare"] > 0 for r in waiting)
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE hold") == 0
    assert await ledger_violations(db) == []
