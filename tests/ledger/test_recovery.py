"""Lease recovery: expiry requeues with attempts + 1, max attempts fails, drain deadlines revoke."""

from __future__ import annotations

from datetime import timedelta

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.recovery import leases_expired_recover
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
TTL = 60.0


def _reconciler(db: Database, name: str = "r") -> Reconciler:
    return Reconciler(db, ReconcilerConfig(lease_ttl_seconds=TTL), owner_id=name, slots=ALL)


async def _setup(db: Database, *, max_attempts: int = 3, count: int = 1, **pool: object):
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0), **pool)
        await heartbeat_add(conn, "rt-p1", at=NOW)
        return await tasks_add(
            conn, tenant="t1", count=count, spec=spec_make(cpu=400, max_attempts=max_attempts)
        )


async def test_expired_lease_requeues_the_task_and_releases_capacity(db: Database) -> None:
    (task_id,) = await _setup(db)
    assert (await _reconciler(db).run_once(now=NOW)).leased == 1
    async with db.transaction() as conn:
        early = await leases_expired_recover(conn, now=NOW + timedelta(seconds=TTL - 1))
    assert early.tasks == 0
    async with db.transaction() as conn:
        late = await leases_expired_recover(conn, now=NOW + timedelta(seconds=TTL))
    assert (late.requeued, late.failed) == (1, 0)
    async with db.connection() as conn:
        task = await task_get(conn, task_id)
        lease = await conn.fetchrow("SELECT state, end_reason FROM leases")
        reserved = await conn.fetchval("SELECT cpu_reserved FROM ledgers")
    assert (task["state"], task["attempts"], task["parked"]) == ("ADMITTED", 1, False)
    assert task["placement"] is None
    assert tuple(lease) == ("EXPIRED", "lease_expired")
    assert reserved == 0
    assert await ledger_violations(db) == []


async def test_past_max_attempts_the_task_fails_with_lease_expired(db: Database) -> None:
    (task_id,) = await _setup(db, max_attempts=2)
    at = NOW
    for attempt in (1, 2):
        async with db.transaction() as conn:
            await heartbeat_add(conn, "rt-p1", at=at)
        assert (await _reconciler(db, f"r{attempt}").run_once(now=at)).leased == 1
        at = at + timedelta(seconds=TTL + 1)
        async with db.transaction() as conn:
            await leases_expired_recover(conn, now=at)
    async with db.connection() as conn:
        task = await task_get(conn, task_id)
        epochs = [r[0] for r in await conn.fetch("SELECT epoch FROM leases ORDER BY 1")]
        last = await conn.fetchrow(
            "SELECT from_state, to_state, reason FROM task_events ORDER BY id DESC LIMIT 1"
        )
    assert (task["state"], task["attempts"], task["failure_reason"]) == (
        "FAILED", 2, "lease_expired"
    )
    assert epochs == [1, 2]
    assert tuple(last) == ("LEASED", "FAILED", "lease_expired")
    assert await ledger_violations(db) == []


async def test_drain_deadline_revokes_leases_through_the_leader(db: Database) -> None:
    ids = await _setup(db, count=2)
    reconciler = _reconciler(db)
    assert (await reconciler.run_once(now=NOW)).leased == 2
    deadline = NOW + timedelta(seconds=10)
    async with db.transaction() as conn:
        await conn.execute("UPDATE pools SET status = 'DRAINING', drain_deadline = $1", deadline)
    try:
        assert await reconciler.recover_once(now=deadline - timedelta(seconds=1)) == 0
        assert await reconciler.recover_once(now=deadline) == 2
    finally:
        await reconciler.ownership.stop()
    async with db.connection() as conn:
        tasks = [await task_get(conn, i) for i in ids]
        leases = {r[0] for r in await conn.fetch("SELECT state FROM leases")}
    assert {(t["state"], t["attempts"]) for t in tasks} == {("ADMITTED", 1)}
    assert leases == {"REVOKED"}
    # The drained pool rejects new placements: the requeued tasks wait with a reason.
    result = await _reconciler(db, "r2").run_once(now=deadline)
    assert (result.leased, result.pending) == (0, 2)
    async with db.connection() as conn:
        task = await task_get(conn, ids[0])
    assert task["parked"] and task["pending_reason"]["code"] == "pool_not_active"
    assert await ledger_violations(db) == []


async def test_only_one_leader_recovers(db: Database) -> None:
    await _setup(db)
    first, second = _reconciler(db, "a"), _reconciler(db, "b")
    assert (await first.run_once(now=NOW)).leased == 1
    later = NOW + timedelta(seconds=TTL + 1)
    try:
        assert await first.ownership.leader()
        assert not await second.ownership.leader()
        assert await second.recover_once(now=later) == 0
        assert await first.recover_once(now=later) == 1
        await first.ownership.stop()
        assert await second.ownership.leader()  # leadership moves when the leader goes
    finally:
        await first.ownership.stop()
        await second.ownership.stop()


async def test_the_leased_tasks_to_take_back_are_locked_by_id_with_stale_statistics(
    db: Database,
) -> None:
    """Statistics from before a burst of leases say nothing is leased: the recovery's and the
    overdue victims' lock statements still look their tasks up by primary key, not by
    reading every leased task from ``ix_tasks_leased_tenant``."""
    from app.ledger import preemption, recovery
    from tests.factories import spec_make, tasks_add

    async with db.connection() as conn:
        ids = await tasks_add(conn, tenant="t1", count=400, spec=spec_make(cpu=1))
        await conn.execute("ANALYZE tasks")  # every task admitted
        await conn.execute("UPDATE tasks SET state = 'LEASED', leased_at = now()")
        for query in (recovery._TASKS_LOCK, preemption._VICTIMS_LOCK):
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + query, ids[:2]))
            assert "ix_tasks_leased_tenant" not in plan, plan
            assert "pk_tasks" in plan, plan


async def _leases_insert(conn, rows: list[tuple[str, str, int]]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Insert leases (name, instance, seconds to expiry from NOW, state) with no tasks behind
    them; return their task ids by name."""
    ids = {}
    for name, instance, seconds, state in rows:
        ids[name] = await conn.fetchval(
            "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
            "expires_at, revoke_by) VALUES (gen_random_uuid(), gen_random_uuid(), 'p1', $1, 1, "
            "$2::text, $3::timestamptz, CASE WHEN $2::text = 'REVOKING' THEN $3::timestamptz END) "
            "RETURNING task_id",
            instance, state, NOW + timedelta(seconds=seconds),
        )
    return ids


async def test_expired_leases_are_found_across_instances_oldest_first(db: Database) -> None:
    """Every instance's expired active leases, oldest first across instances up to the
    limit; never a revoking lease, an ended one or one expiring later."""
    from app.ledger import recovery

    async with db.transaction() as conn:
        ids = await _leases_insert(conn, [
            ("a-old", "rt-a", -50, "ACTIVE"), ("a-new", "rt-a", -10, "ACTIVE"),
            ("a-live", "rt-a", 30, "ACTIVE"), ("b-mid", "rt-b", -30, "ACTIVE"),
            ("b-revoking", "rt-b", -40, "REVOKING"), ("c-ended", "rt-c", -60, "EXPIRED"),
            ("d-oldest", "rt-d", -70, "ACTIVE"), ("e-live", "rt-e", 5, "ACTIVE"),
        ])
        found = [r[0] for r in await conn.fetch(recovery._EXPIRED, NOW, 10)]
        first = [r[0] for r in await conn.fetch(recovery._EXPIRED, NOW, 2)]
    assert set(found) == {ids["a-old"], ids["a-new"], ids["b-mid"], ids["d-oldest"]}
    assert set(first) == {ids["d-oldest"], ids["a-old"]}


async def test_the_expired_scan_reads_the_live_leases_index_not_the_history(
    db: Database,
) -> None:
    """No index holds every lease by expiry: the scan reads ``ix_leases_instance_expiry``
    (live leases only), testing the expiry in the index, not the ended leases."""
    from app.ledger import recovery

    async with db.transaction() as conn:
        # 500 live leases on 50 instances beside 4,500 ended ones.
        await conn.execute(
            "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
            "expires_at, ended_at) SELECT gen_random_uuid(), gen_random_uuid(), 'p1', "
            "'rt-' || (g % 50), 1, CASE WHEN g % 10 = 0 THEN 'ACTIVE' ELSE 'COMPLETED' END, "
            "now(), CASE WHEN g % 10 <> 0 THEN now() END FROM generate_series(1, 5000) AS g"
        )
        await conn.execute("ANALYZE leases")
        plan = "\n".join(
            r[0] for r in await conn.fetch("EXPLAIN " + recovery._EXPIRED, NOW, 500))
    assert "Seq Scan" not in plan, plan
    assert "Index Scan using ix_leases_instance_expiry" in plan, plan
    assert "Index Cond: (expires_at <=" in plan, plan
