"""Quota race: four `berth reconcile` processes, each owning a quarter of the shard slots (so
other tenants), place the tasks of borrowers of one cohort on the same pools at once.

The tasks are admitted in one transaction once all four listen, and the wakeup reaches them
together: their first passes read the same quota rows and the same lendable total, and only
the ledger's conditional updates keep them from lending the same millicores twice. A checker
reads the ledger, in one snapshot per round, all the time the processes run: no tenant past
its nominal plus borrowing limit, no cohort lending more than its lenders lend, every usage
row equal to the sum of its tenant's live leases, every cohort row to the sum of what its
tenants borrow, every pool's reserved amount to the sum of its reservations
(:func:`~app.ledger.invariants.ledger_check`). No lease ends in this test, so usage and
borrowing only grow: a limit broken by any pass stays broken, and the checker's next round
(or the last, after the processes stopped) sees it.
"""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from app.db import Connection, Database
from app.ledger.invariants import ledger_check
from app.ledger.tenants import Quota, tenant_put
from app.ledger.wakeups import WakeSource, wakeup_notify
from app.reconciler.listener import APPLICATION_NAME
from app.shards import shard_of, shard_slots_static
from tests.factories import (
    ledger_violations,
    pools_add,
    processes_stop,
    reconcile_process,
    spec_make,
    tasks_add,
)

pytestmark = pytest.mark.slow

COUNT = 4
#: Lenders place nothing: the cohort lends min(lendingLimit, nominal) of theirs, 7000m.
LENDERS = {"lender-a": (4000, 3000), "lender-b": (5000, 4000)}
LENDABLE = 3000 + 4000
#: Borrowers: nominal 0, and a borrowing limit (None: only the cohort limits them).
BORROW_LIMITS = [1500, None, 2500, None, 1200, None, 3000, None]
#: The outsider, of another cohort, runs on its own nominal and borrows nothing from "c".
OUTSIDER = 500


def _borrowers() -> list[str]:
    """Two borrowers per process's shard set, so that every process places some."""
    out: list[str] = []
    by_owner: dict[int, int] = {}
    i = 0
    while len(out) < len(BORROW_LIMITS):
        name = f"borrower-{i}"
        owner = next(k for k in range(COUNT) if shard_of(name) in shard_slots_static(k, COUNT))
        if by_owner.get(owner, 0) < 2:
            by_owner[owner] = by_owner.get(owner, 0) + 1
            out.append(name)
        i += 1
    return out


def _start(database_url: str, index: int) -> subprocess.Popen:
    return reconcile_process(database_url, "--shard", f"{index}/{COUNT}",
                             stdout=subprocess.DEVNULL, batch_size=16)


async def _listening(conn: Connection) -> int:
    return int(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = $1", APPLICATION_NAME))


async def _check(conn: Connection, caps: dict[str, int | None]) -> tuple[int, int]:
    """Check every limit and invariant in one snapshot; return (cohort c's usage, the
    outsider's)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        used = {r[0]: int(r[1]) for r in await conn.fetch(
            "SELECT t.tenant_id, sum(r.cpu) FROM reservations r JOIN tasks t "
            "ON t.id = r.task_id WHERE NOT r.hold GROUP BY 1")}
        # What the cohort's members draw on it stays within what they lend it.
        lent = await conn.fetch("SELECT c.used, c.cap FROM cohort_usage c WHERE c.cohort = 'c'")
        broken = {k: v for k, v in (await ledger_check(conn)).items() if v}
    assert broken == {}, broken
    for tenant, cap in caps.items():
        assert cap is None or used.get(tenant, 0) <= cap, (tenant, used)
    for borrowed, lendable in lent:
        assert borrowed <= lendable, (borrowed, lendable, used)
    inside = sum(v for k, v in used.items() if k != "outsider")
    assert inside <= LENDABLE, used
    return inside, used.get("outsider", 0)


async def test_four_reconciler_processes_never_exceed_a_quota_limit(
    db: Database, database_url: str
) -> None:
    borrowers = _borrowers()
    caps: dict[str, int | None] = dict(zip(borrowers, BORROW_LIMITS, strict=True))
    caps["outsider"] = OUTSIDER
    fresh = datetime.now(UTC) + timedelta(hours=1)  # the processes read the real clock
    async with db.transaction() as conn:
        await pools_add(conn, 8, tenants=[*LENDERS, *borrowers, "outsider"],
                        capacity=(64_000, 64_000, 0), heartbeat_at=fresh)
        now = datetime.now(UTC)
        for name, (nominal, lend) in LENDERS.items():
            await tenant_put(conn, tenant_id=name, cohort="c", fair_weight=1.0, now=now,
                             quotas={"standard": {"cpuMillis": Quota(nominal, None, lend)}})
        for name in borrowers:
            limit = caps[name]
            quotas = {} if limit is None else {
                "standard": {"cpuMillis": Quota(0, limit, None)}}
            await tenant_put(conn, tenant_id=name, cohort="c", fair_weight=1.0, now=now,
                             quotas=quotas)
        await tenant_put(conn, tenant_id="outsider", cohort="other", fair_weight=1.0,
                         now=now, quotas={"standard": {"cpuMillis": Quota(OUTSIDER, 0, None)}})

    procs = [_start(database_url, i) for i in range(COUNT)]
    try:
        async with db.connection() as conn:
            for _ in range(3000):
                if await _listening(conn) == COUNT:
                    break
                dead = [p for p in procs if p.poll() is not None]
                if dead:
                    pytest.fail(dead[0].stderr.read().decode()[-2000:])  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the reconcilers never all listened")
            # All admitted at once, and all four woken by the one commit.
            async with conn.transaction():
                for name in borrowers:
                    await tasks_add(conn, tenant=name, count=60, spec=spec_make(cpu=100))
                await tasks_add(conn, tenant="outsider", count=20, spec=spec_make(cpu=100))
                await wakeup_notify(conn, source=WakeSource.SUBMITTED)
            # Demand (6000m per borrower) is far above what is lent: the run is over when
            # every lendable millicore is taken. Check after every round until then.
            rounds = 0
            while rounds < 20_000:
                rounds += 1
                inside, outside = await _check(conn, caps)
                if inside == LENDABLE and outside == OUTSIDER:
                    break
                dead = [p for p in procs if p.poll() is not None]
                if dead:
                    pytest.fail(dead[0].stderr.read().decode()[-2000:])  # type: ignore[union-attr]
                await asyncio.sleep(0.001)
            if (inside, outside) != (LENDABLE, OUTSIDER):
                pytest.fail(f"the cohort never lent all it has: {inside}m of {LENDABLE}m")
            passes = int(await conn.fetchval(
                "SELECT count(DISTINCT xmin::text) FROM leases"))
    finally:
        processes_stop(procs)
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
    # 75 placements, at most 16 a pass: the checker ran while at least five passes committed.
    assert rounds >= 1 and passes >= 5
    # After the processes stopped, nothing more was placed: still within every limit.
    async with db.connection() as conn:
        assert await _check(conn, caps) == (LENDABLE, OUTSIDER)
    assert await ledger_violations(db) == []
