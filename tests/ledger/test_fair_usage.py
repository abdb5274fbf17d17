"""Fair sharing's decayed usage in the ledger: a row starts at the usage of the moment, moves
toward the usage by half the distance per half-life, moves at most once per pass clock, and
a row another transaction is updating is skipped, not waited for."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from app.db import Database
from app.ledger.fairshare import fair_usage_decay, fair_weights_read
from app.ledger.quotas import quota_charge
from app.ledger.tenants import Quota, tenant_put

HALF = 60.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _setup(db: Database) -> None:
    async with db.transaction() as conn:
        await tenant_put(conn, tenant_id="a", cohort="c", fair_weight=2.5, now=T0,
                         quotas={"standard": {"cpuMillis": Quota(8000)}})
        await quota_charge(conn, amounts={("a", "standard", "cpuMillis"): 4000}, exists=())


async def _decay(conn, at: datetime) -> float:
    got = await fair_usage_decay(conn, tenant_ids=["a"], runtime_classes=["standard"],
                                 half_life_seconds=HALF, now=at)
    return got[("a", "standard")][0]


async def test_decayed_usage_halves_the_distance_per_half_life(db: Database) -> None:
    await _setup(db)
    async with db.transaction() as conn:
        assert await fair_weights_read(conn, tenant_ids=["a", "nobody"]) == {"a": 2.5}
        assert await _decay(conn, T0) == 4000.0  # a new row starts at the usage
        await conn.execute("UPDATE quota_usage SET used = 0 WHERE tenant_id = 'a'")
        assert await _decay(conn, T0) == 4000.0  # at most once per pass clock
        assert await _decay(conn, T0 + timedelta(seconds=HALF)) == pytest.approx(2000.0)
        assert await _decay(conn, T0 + timedelta(seconds=3 * HALF)) == pytest.approx(500.0)
        await conn.execute("UPDATE quota_usage SET used = 8000 WHERE tenant_id = 'a'")
        assert await _decay(conn, T0 + timedelta(seconds=4 * HALF)) == pytest.approx(4250.0)


async def test_a_quota_removed_takes_its_decayed_usage_with_it(db: Database) -> None:
    await _setup(db)
    async with db.transaction() as conn:
        await tenant_put(conn, tenant_id="b", cohort="c", fair_weight=1.0, now=T0,
                         quotas={"standard": {"cpuMillis": Quota(2000)}})
        await fair_usage_decay(conn, tenant_ids=["a", "b"], runtime_classes=["standard"],
                               half_life_seconds=HALF, now=T0)
        assert await conn.fetchval("SELECT count(*) FROM fair_usage") == 2
        # a leaves quota management (its leases gone): its decayed usage goes with it, so a
        # quota given back later starts from the usage of that moment, not a stale average.
        await conn.execute("UPDATE quota_usage SET used = 0 WHERE tenant_id = 'a'")
        await tenant_put(conn, tenant_id="a", cohort="c", fair_weight=2.5, now=T0,
                         quotas={})
        rows = await conn.fetch("SELECT tenant_id FROM fair_usage")
        assert [r[0] for r in rows] == ["b"]


async def test_a_row_being_updated_elsewhere_is_read_as_committed(db: Database) -> None:
    await _setup(db)
    async with db.transaction() as conn:
        await _decay(conn, T0)
    later = T0 + timedelta(seconds=HALF)
    async with db.transaction() as holder:
        await _lock(holder)
        async with db.transaction() as conn:
            # The other pass does not wait for the lock: it reads the committed value.
            got = await asyncio.wait_for(_decay(conn, later), timeout=30)
            assert got == 4000.0


async def _lock(conn) -> None:
    await conn.execute("SELECT 1 FROM fair_usage FOR UPDATE")
