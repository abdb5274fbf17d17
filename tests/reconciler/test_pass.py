"""One pass against the real database: claim, select, reserve, lease, park."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

import app.reconciler.passes as passes
from app.config import SHARD_SLOTS
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import (
    NOW,
    heartbeat_add,
    ledger_violations,
    pool_add,
    spec_make,
    task_get,
    tasks_add,
)

ALL = frozenset(range(SHARD_SLOTS))


def reconciler(db: Database, **config: object) -> Reconciler:
    return Reconciler(db, ReconcilerConfig(**config), owner_id="test", slots=ALL)


async def test_pass_leases_tasks_and_reserves_capacity(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        ids = await tasks_add(conn, tenant="t1", count=3, spec=spec_make(cpu=300))
    result = await reconciler(db).run_once(now=NOW)
    assert (result.claimed, result.leased, result.pending) == (3, 3, 0)
    async with db.connection() as conn:
        reserved = await conn.fetchval("SELECT cpu_reserved FROM ledgers")
        task = await task_get(conn, ids[0])
        lease = await conn.fetchrow(
            "SELECT runtime_instance_id, epoch, expires_at FROM leases WHERE task_id = $1", ids[0]
        )
    assert reserved == 900
    assert task["state"] == "LEASED"
    assert task["placement"]["poolId"] == "p1"
    assert lease[0] == "rt-p1" and lease[1] == 1
    assert await ledger_violations(db) == []


async def _pool(conn, pool_id: str, capacity=(1000, 1000, 0), **kw) -> None:
    await pool_add(conn, pool_id, tenants=kw.pop("tenants", ["t1"]), capacity=capacity, **kw)
    await heartbeat_add(conn, f"rt-{pool_id}", at=NOW)


async def test_tasks_that_fit_nowhere_are_parked_with_their_reason(db: Database) -> None:
    async with db.transaction() as conn:
        await _pool(conn, "p1", capacity=(1000, 1000, 0))
        ids = await tasks_add(conn, tenant="t1", count=5, spec=spec_make(cpu=400))
    result = await reconciler(db).run_once(now=NOW)
    assert (result.claimed, result.leased, result.pending) == (5, 2, 3)
    assert result.unsatisfiable_hits == 2  # the 4th and 5th reuse the 3rd's verdict
    async with db.connection() as conn:
        parked = await task_get(conn, ids[4])
    assert parked["state"] == "ADMITTED" and parked["parked"]
    assert parked["pending_reason"]["code"] == "insufficient_cpu"
    assert parked["pending_reason"]["rejections"] == {"insufficient_cpu": 1}
    # Parked tasks are not claimed again until a wakeup unparks them: no hot loop.
    assert (await reconciler(db).run_once(now=NOW)).claimed == 0
    assert await ledger_violations(db) == []


async def test_unhealthy_and_unregistered_pools_fail_closed(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "stale", tenants=["t1"])
        await heartbeat_add(conn, "rt-stale", at=NOW - timedelta(seconds=60))
        await pool_add(conn, "noledger", tenants=["t1"], capacity=None)
        await heartbeat_add(conn, "rt-noledger", at=NOW)
        (task_id,) = await tasks_add(conn, tenant="t1")
    assert (await reconciler(db).run_once(now=NOW)).pending == 1
    async with db.connection() as conn:
        reason = (await task_get(conn, task_id))["pending_reason"]
    assert reason["rejections"] == {"runtime_unhealthy": 1, "ledger_missing": 1}


async def test_gang_reserves_every_member_or_none(db: Database) -> None:
    async with db.transaction() as conn:
        for p in ("p1", "p2", "p3"):
            await _pool(conn, p, capacity=(1000, 1000, 0))
        (fits,) = await tasks_add(conn, tenant="t1", spec=spec_make(
            cpu=500, gang={"members": 5, "minPools": 3}))
        (too_big,) = await tasks_add(conn, tenant="t1", spec=spec_make(
            cpu=500, gang={"members": 2, "minPools": 2}))
    result = await reconciler(db).run_once(now=NOW)
    assert (result.leased, result.pending) == (1, 1)
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT r.pool_id, r.members, r.cpu, l.runtime_instance_id, l.epoch "
            "FROM reservations r JOIN leases l ON l.task_id = r.task_id AND l.pool_id = r.pool_id "
            "WHERE r.task_id = $1 ORDER BY r.pool_id", fits)
        big = await task_get(conn, too_big)
        reserved = [r[0] for r in await conn.fetch(
            "SELECT cpu_reserved FROM ledgers ORDER BY pool_id")]
    assert sum(r[1] for r in rows) == 5 and len(rows) == 3
    assert all(r[2] == r[1] * 500 and r[3] == f"rt-{r[0]}" and r[4] == 1 for r in rows)
    assert sorted(reserved) == [500, 1000, 1000]
    assert big["state"] == "ADMITTED" and big["pending_reason"]["code"] == "gang_unsatisfiable"
    assert await ledger_violations(db) == []


async def test_affinity_sees_leased_placements_of_the_tenant(db: Database) -> None:
    async with db.transaction() as conn:
        await _pool(conn, "p1")
        await _pool(conn, "p2")
        (anchor,) = await tasks_add(conn, tenant="t1", spec=spec_make(labels={"app": "db"}))
    assert (await reconciler(db).run_once(now=NOW)).leased == 1
    async with db.connection() as conn:
        anchor_pool = (await task_get(conn, anchor))["placement"]["poolId"]
    follower = spec_make(affinity={"required": [{"selector": {"app": "db"}, "topology": "pool"}]})
    away = spec_make(affinity={"required": [
        {"selector": {"app": "db"}, "topology": "pool", "anti": True}]})
    async with db.transaction() as conn:
        near, far = await tasks_add(conn, tenant="t1", specs=[follower, away])
    assert (await reconciler(db).run_once(now=NOW)).leased == 2
    async with db.connection() as conn:
        assert (await task_get(conn, near))["placement"]["poolId"] == anchor_pool
        assert (await task_get(conn, far))["placement"]["poolId"] != anchor_pool


async def test_placement_json_carries_components_and_alternatives(db: Database) -> None:
    async with db.transaction() as conn:
        for p in ("p1", "p2", "p3"):
            await _pool(conn, p)
        (task_id,) = await tasks_add(conn, tenant="t1")
    await reconciler(db, top_k=2).run_once(now=NOW)
    async with db.connection() as conn:
        placement = (await task_get(conn, task_id))["placement"]
    assert placement["members"] == [{"poolId": placement["poolId"], "count": 1}]
    assert placement["components"] and len(placement["alternatives"]) == 1


async def test_invisible_pools_leave_the_task_pending(db: Database) -> None:
    async with db.transaction() as conn:
        await _pool(conn, "p1", tenants=["someone-else"])
        (task_id,) = await tasks_add(conn, tenant="t1")
    assert (await reconciler(db).run_once(now=NOW)).pending == 1
    async with db.connection() as conn:
        reason = (await task_get(conn, task_id))["pending_reason"]
    assert reason["code"] == "tenant_not_allowed"


async def test_no_owned_slots_claims_nothing(db: Database) -> None:
    async with db.transaction() as conn:
        await _pool(conn, "p1")
        await tasks_add(conn, tenant="t1")
    idle = Reconciler(db, ReconcilerConfig(), owner_id="x", slots=frozenset())
    assert (await idle.run_once(now=NOW)).claimed == 0


async def test_an_unreadable_stored_spec_is_parked_without_blocking_the_batch(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        await _pool(conn, "p1")
        broken, good = await tasks_add(conn, tenant="t1", specs=[
            spec_make(cpu=-5), spec_make(cpu=100)])
    result = await reconciler(db).run_once(now=NOW)
    assert (result.leased, result.pending) == (1, 1)
    async with db.connection() as conn:
        bad = await task_get(conn, broken)
        assert (await task_get(conn, good))["state"] == "LEASED"
    assert bad["state"] == "ADMITTED" and bad["parked"]
    assert bad["pending_reason"]["code"] == "invalid_spec"


async def test_a_pass_that_hangs_holding_its_claims_is_ended_by_the_server(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claims are the row locks of the pass's transaction: a pass idle in it longer than
    the claim TTL loses its session, and its tasks are claimable again, untouched."""
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=300))
    real_commit = passes.pass_commit

    async def hang(*args, **kwargs):
        await asyncio.sleep(1.5)  # idle in the transaction, past the 0.5 s TTL
        return await real_commit(*args, **kwargs)

    monkeypatch.setattr(passes, "pass_commit", hang)
    with pytest.raises(Exception, match="idle-in-transaction|closed|terminat"):
        await reconciler(db, claim_ttl_seconds=0.5, retry_attempts=1).run_once(now=NOW)
    monkeypatch.undo()
    async with db.connection() as conn:
        assert (await task_get(conn, task_id))["state"] == "ADMITTED"
    result = await reconciler(db).run_once(now=NOW)
    assert (result.claimed, result.leased) == (1, 1)
    assert await ledger_violations(db) == []
