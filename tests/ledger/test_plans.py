"""``plan_apply``: a plan is written whole in one transaction, or not at all with the pools
that lost the race named."""

from __future__ import annotations

from datetime import timedelta

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.claims import tasks_claim
from app.ledger.plans import Grant, Plan, Unclaim, plan_apply
from tests.factories import NOW, ledger_violations, pool_add, spec_make, task_get, tasks_add

ALL = frozenset(range(SHARD_SLOTS))
OWNER = "planner/1"


async def _claimed(db: Database, count: int) -> list:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await pool_add(conn, "p2", tenants=["t1"], capacity=(1000, 1000, 0))
        ids = await tasks_add(conn, tenant="t1", count=count, spec=spec_make(cpu=400))
        await tasks_claim(conn, owner=OWNER, slots=ALL, batch=count, now=NOW,
                          claim_ttl_seconds=30)
    return ids


def _grant(task_id, pool_id: str, cpu: int = 400) -> Grant:
    return Grant(task_id, {"poolId": pool_id}, ((pool_id, 1, f"rt-{pool_id}"),), (cpu, 0, 0))


async def _apply(db: Database, plan: Plan):
    async with db.connection() as conn:
        return await plan_apply(conn, plan=plan, owner=OWNER, now=NOW, lease_ttl_seconds=60)


async def _written(db: Database) -> tuple:
    async with db.connection() as conn:
        return (
            await conn.fetchval("SELECT count(*) FROM reservations"),
            await conn.fetchval("SELECT count(*) FROM leases"),
            await conn.fetchval("SELECT SUM(cpu_reserved) FROM ledgers"),
            await conn.fetchval("SELECT count(*) FROM tasks WHERE state = 'CLAIMED'"),
            await conn.fetchval(
                "SELECT count(*) FROM task_events WHERE reason <> 'claimed'"),
        )


async def test_a_plan_is_applied_whole(db: Database) -> None:
    a, b, c = await _claimed(db, 3)
    reason = {"code": "insufficient_cpu", "message": "no room", "rejections": {}}
    result = await _apply(db, Plan(
        grants=(_grant(a, "p1"), _grant(b, "p2")),
        unclaims=(Unclaim(c, "insufficient_cpu", reason, parked=True),),
    ))
    assert result.applied and result.lost == frozenset()
    assert (result.leased, result.unclaimed) == ({a, b}, {c})
    assert await _written(db) == (2, 2, 800, 0, 3)
    async with db.connection() as conn:
        lease = await conn.fetchrow("SELECT runtime_instance_id, epoch, expires_at "
                                    "FROM leases WHERE task_id = $1", a)
        assert (await task_get(conn, a))["placement"] == {"poolId": "p1"}
        assert (await task_get(conn, c))["pending_reason"] == reason
    assert tuple(lease) == ("rt-p1", 1, NOW + timedelta(seconds=60))
    assert await ledger_violations(db) == []


async def test_a_lost_race_returns_the_pools_and_writes_nothing(db: Database) -> None:
    a, b, c = await _claimed(db, 3)
    async with db.connection() as conn:  # a rival got to p2 first
        await conn.execute("UPDATE ledgers SET cpu_reserved = 700 WHERE pool_id = 'p2'")
    plan = Plan(
        grants=(_grant(a, "p1"), _grant(b, "p2")),
        unclaims=(Unclaim(c, "reservation_conflict"),),
    )
    result = await _apply(db, plan)
    assert not result.applied
    assert result.lost == {"p2"}
    assert (result.leased, result.unclaimed) == (frozenset(), frozenset())
    # Nothing of the plan was written, not even for the pool that had room.
    assert await _written(db) == (0, 0, 700, 3, 0)

    # Without the lost pool's grant, the same tasks apply (they are still claimed).
    retry = Plan(grants=(_grant(a, "p1"),), unclaims=(Unclaim(b, "reservation_conflict"),
                                                      Unclaim(c, "reservation_conflict")))
    again = await _apply(db, retry)
    assert again.applied and (again.leased, again.unclaimed) == ({a}, {b, c})
    async with db.connection() as conn:  # the rival's 700 on p2 has no reservation behind it
        await conn.execute("UPDATE ledgers SET cpu_reserved = 0 WHERE pool_id = 'p2'")
    assert await ledger_violations(db) == []


async def test_tasks_no_longer_claimed_are_left_out(db: Database) -> None:
    a, b = await _claimed(db, 2)
    async with db.connection() as conn:  # b was cancelled meanwhile
        await conn.execute("UPDATE tasks SET state = 'CANCELLED', claim_owner = NULL "
                           "WHERE id = $1", b)
    result = await _apply(db, Plan(grants=(_grant(a, "p1"), _grant(b, "p1"))))
    assert result.applied and result.leased == {a}
    async with db.connection() as conn:
        # Only the leased task's amount is reserved.
        assert await conn.fetchval("SELECT cpu_reserved FROM ledgers WHERE pool_id = 'p1'") == 400
    assert await ledger_violations(db) == []


async def test_inside_a_callers_transaction_a_lost_race_rolls_back_only_the_plan(
    db: Database,
) -> None:
    (a,) = await _claimed(db, 1)
    async with db.connection() as conn:
        await conn.execute("UPDATE ledgers SET cpu_total = 100 WHERE pool_id = 'p1'")
    async with db.transaction() as conn:
        await conn.execute("UPDATE pools SET ready = false WHERE id = 'p2'")
        result = await plan_apply(conn, plan=Plan(grants=(_grant(a, "p1"),)), owner=OWNER,
                                  now=NOW, lease_ttl_seconds=60)
    assert result.lost == {"p1"}
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT ready FROM pools WHERE id = 'p2'") is False
        assert (await task_get(conn, a))["state"] == "CLAIMED"
        assert await conn.fetchval("SELECT count(*) FROM reservations") == 0
