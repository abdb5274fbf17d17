"""Quota race up a tree: four `berth reconcile` processes, each owning a quarter of the shard
slots, place the tasks of eight borrowers of one team at once, on the same pools.

The tree has three levels: ``org`` pools what ``lenders`` (a team whose tenants place
nothing) lends it, 7000m; ``borrowers`` (a team with nothing of its own) may borrow at most
3000m of it. The passes' first reads are the same, so only the conditional update of each
level keeps them from letting the team past its limit or the org past what it holds. A
checker reads every level in one snapshot per round while the processes run: no borrower
past its own limit, the team within 3000m, the org within 7000m, every level's row equal
to what its members draw (:func:`~app.ledger.invariants.ledger_check`). No lease ends, so a
limit broken by any pass stays broken.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from app.db import Connection, Database
from app.ledger.cohorts import cohort_put
from app.ledger.invariants import ledger_check
from app.ledger.tenants import Quota, tenant_put
from app.ledger.wakeups import WakeSource, wakeup_notify
from tests.factories import ledger_violations, pools_add, processes_stop, spec_make, tasks_add
from tests.reconciler.test_quota_race import COUNT, LENDERS, _borrowers, _listening, _start

pytestmark = pytest.mark.slow

TEAM_LIMIT = 3000
#: Borrowers' own limits (None: only the tree limits them).
BORROW_LIMITS = [1500, None, 800, None, 1200, None, 600, None]


async def _check(conn: Connection, caps: dict[str, int | None]) -> int:
    """Check every level's limit and every invariant in one snapshot; return what the
    borrowing team's members draw on it."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        used = {r[0]: int(r[1]) for r in await conn.fetch(
            "SELECT t.tenant_id, sum(r.cpu) FROM reservations r JOIN tasks t "
            "ON t.id = r.task_id WHERE NOT r.hold GROUP BY 1")}
        level = {r[0]: (int(r[1]), int(r[2])) for r in await conn.fetch(
            "SELECT cohort, used, cap FROM cohort_usage WHERE resource = 'cpuMillis'")}
        broken = {k: v for k, v in (await ledger_check(conn)).items() if v}
    assert broken == {}, broken
    for tenant, cap in caps.items():
        assert cap is None or used.get(tenant, 0) <= cap, (tenant, used)
    assert level["borrowers"][0] <= TEAM_LIMIT, level
    assert level["org"][0] <= level["org"][1], level
    return level["borrowers"][0]


async def test_four_reconcilers_never_take_a_team_past_its_limit(
    db: Database, database_url: str
) -> None:
    borrowers = _borrowers()
    caps: dict[str, int | None] = dict(zip(borrowers, BORROW_LIMITS, strict=True))
    fresh = datetime.now(UTC) + timedelta(hours=1)
    async with db.transaction() as conn:
        await pools_add(conn, 8, tenants=[*LENDERS, *borrowers], capacity=(64_000, 64_000, 0),
                        heartbeat_at=fresh)
        now = datetime.now(UTC)
        await cohort_put(conn, cohort_id="org", parent=None, fair_weight=1.0, now=now,
                         quotas={})
        await cohort_put(conn, cohort_id="lenders", parent="org", fair_weight=1.0, now=now,
                         quotas={})
        await cohort_put(conn, cohort_id="borrowers", parent="org", fair_weight=1.0, now=now,
                         quotas={"standard": {"cpuMillis": Quota(0, TEAM_LIMIT)}})
        for name, (nominal, lend) in LENDERS.items():
            await tenant_put(conn, tenant_id=name, cohort="lenders", fair_weight=1.0, now=now,
                             quotas={"standard": {"cpuMillis": Quota(nominal, None, lend)}})
        for name in borrowers:
            limit = caps[name]
            quotas = {} if limit is None else {
                "standard": {"cpuMillis": Quota(0, limit, None)}}
            await tenant_put(conn, tenant_id=name, cohort="borrowers", fair_weight=1.0,
                             now=now, quotas=quotas)

    procs = [_start(database_url, i) for i in range(COUNT)]
    try:
        async with db.connection() as conn:
            for _ in range(3000):
                if await _listening(conn) == COUNT:
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the reconcilers never all listened")
            async with conn.transaction():
                for name in borrowers:
                    await tasks_add(conn, tenant=name, count=40, spec=spec_make(cpu=100))
                await wakeup_notify(conn, source=WakeSource.SUBMITTED)
            # Demand (4000m per borrower) is far above the team's limit: the run is over
            # when the team has borrowed all it may.
            drawn = 0
            for _ in range(20_000):
                drawn = await _check(conn, caps)
                if drawn == TEAM_LIMIT:
                    break
                dead = [p for p in procs if p.poll() is not None]
                if dead:
                    pytest.fail(dead[0].stderr.read().decode()[-2000:])  # type: ignore[union-attr]
                await asyncio.sleep(0.001)
            assert drawn == TEAM_LIMIT, f"the team never borrowed all it may: {drawn}m"
    finally:
        processes_stop(procs)
    async with db.connection() as conn:
        assert await _check(conn, caps) == TEAM_LIMIT
    assert await ledger_violations(db) == []
