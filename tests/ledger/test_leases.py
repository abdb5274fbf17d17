"""Leases: heartbeats, a runtime's lease list, completion with fencing, cancel, revoke."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.leases import (
    LeaseNotFound,
    LeaseOutcomeInvalid,
    LeaseStale,
    TaskNotCancellable,
    lease_complete,
    pool_leases_revoke,
    runtime_heartbeat,
    runtime_leases_list,
    task_cancel,
)
from app.ledger.recovery import leases_expired_recover
from app.ledger.tasks import TaskNotFound
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import (
    NOW,
    heartbeat_add,
    ledger_violations,
    placement_on,
    pool_add,
    spec_make,
    task_get,
    tasks_add,
)

ALL = frozenset(range(SHARD_SLOTS))
TTL = 60.0


async def _placed(db: Database, count: int = 1, *, cpu: int = 500, max_attempts: int = 3):
    """Create one healthy pool p1 and ``count`` tasks leased on it; return the task ids."""
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        ids = await tasks_add(
            conn, tenant="t1", count=count, spec=spec_make(cpu=cpu, max_attempts=max_attempts)
        )
    result = await Reconciler(
        db, ReconcilerConfig(lease_ttl_seconds=TTL), owner_id="t", slots=ALL
    ).run_once(now=NOW)
    assert result.leased == count
    return ids


async def _lease_of(db: Database, task_id: uuid.UUID) -> tuple[uuid.UUID, int]:
    async with db.connection() as conn:
        row = await conn.fetchrow(
            "SELECT id, epoch FROM leases WHERE task_id = $1 AND state = 'ACTIVE'", task_id
        )
        assert row is not None
    return row[0], int(row[1])


async def _cpu_reserved(db: Database, pool_id: str = "p1") -> int:
    async with db.connection() as conn:
        return await conn.fetchval("SELECT cpu_reserved FROM ledgers WHERE pool_id = $1", pool_id)


async def test_heartbeat_first_time_wakes_and_renews_live_leases(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"])
        first = await runtime_heartbeat(conn, instance_id="rt-p1", now=NOW, lease_ttl_seconds=TTL)
        again = await runtime_heartbeat(
            conn, instance_id="rt-p1", now=NOW + timedelta(seconds=1), lease_ttl_seconds=TTL
        )
        stranger = await runtime_heartbeat(
            conn, instance_id="rt-unknown", now=NOW, lease_ttl_seconds=TTL
        )
    assert first.became_healthy and not again.became_healthy
    assert not stranger.became_healthy  # no pool names it: nobody to wake

    async with db.transaction() as conn:
        await conn.execute("DELETE FROM pools")
    (task_id,) = await _placed(db)
    later = NOW + timedelta(seconds=30)
    async with db.transaction() as conn:
        beat = await runtime_heartbeat(conn, instance_id="rt-p1", now=later, lease_ttl_seconds=TTL)
        expires = await conn.fetchval("SELECT expires_at FROM leases WHERE task_id = $1", task_id)
    assert beat.renewed_leases == 1
    assert expires == later + timedelta(seconds=TTL)


async def test_heartbeat_after_staleness_is_healthy_again_but_expired_leases_stay_expired(
    db: Database,
) -> None:
    await _placed(db)
    much_later = NOW + timedelta(seconds=TTL + 100)
    async with db.transaction() as conn:
        beat = await runtime_heartbeat(
            conn, instance_id="rt-p1", now=much_later, lease_ttl_seconds=TTL
        )
    assert beat.became_healthy
    assert beat.renewed_leases == 0  # past its expiry: recovery owns it, not the runtime


async def test_leases_list_shows_live_leases_of_the_instance(db: Database) -> None:
    (task_id,) = await _placed(db)
    async with db.connection() as conn:
        items = await runtime_leases_list(conn, instance_id="rt-p1")
        none = await runtime_leases_list(conn, instance_id="rt-other")
    assert none == []
    (item,) = items
    assert item["taskId"] == str(task_id)
    assert item["poolId"] == "p1" and item["runtimeInstanceId"] == "rt-p1"
    assert item["epoch"] == 1 and item["members"] == 1
    assert item["requests"] == {"cpuMillis": 500, "memoryMiB": 0, "llmSlots": 0}
    assert item["expiresAt"] == (NOW + timedelta(seconds=TTL)).isoformat()


async def test_complete_succeeded_releases_capacity_in_the_same_transaction(
    db: Database,
) -> None:
    (task_id,) = await _placed(db)
    lease_id, epoch = await _lease_of(db, task_id)
    assert await _cpu_reserved(db) == 500
    async with db.transaction() as conn:
        out = await lease_complete(
            conn, lease_id=lease_id, epoch=epoch, outcome="succeeded", message=None,
            now=NOW, instance_ids=frozenset({"rt-p1"}),
        )
    assert out["state"] == "SUCCEEDED"
    assert await _cpu_reserved(db) == 0
    async with db.connection() as conn:
        task = await task_get(conn, task_id)
        lease_state = await conn.fetchval("SELECT state FROM leases WHERE id = $1", lease_id)
        events = [r[0] for r in await conn.fetch(
            "SELECT to_state FROM task_events WHERE task_id = $1 ORDER BY id", task_id
        )]
    assert task["state"] == "SUCCEEDED" and task["finished_at"] == NOW
    assert lease_state == "COMPLETED"
    assert events == ["LEASED", "SUCCEEDED"]
    assert await ledger_violations(db) == []


async def test_complete_failed_marks_the_task_failed(db: Database) -> None:
    (task_id,) = await _placed(db)
    lease_id, epoch = await _lease_of(db, task_id)
    async with db.transaction() as conn:
        out = await lease_complete(
            conn, lease_id=lease_id, epoch=epoch, outcome="failed", message="exit 1",
            now=NOW, instance_ids=None,
        )
    assert out["state"] == "FAILED"
    assert await _cpu_reserved(db) == 0


async def test_complete_refuses_unknown_foreign_and_invalid(db: Database) -> None:
    (task_id,) = await _placed(db)
    lease_id, epoch = await _lease_of(db, task_id)
    async with db.connection() as conn:
        with pytest.raises(LeaseNotFound):
            await lease_complete(conn, lease_id=uuid.uuid4(), epoch=1, outcome="succeeded",
                                 message=None, now=NOW, instance_ids=None)
        with pytest.raises(LeaseNotFound):
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="succeeded",
                                 message=None, now=NOW, instance_ids=frozenset({"rt-other"}))
        with pytest.raises(LeaseOutcomeInvalid):
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="done",
                                 message=None, now=NOW, instance_ids=None)
        with pytest.raises(LeaseStale, match="stale epoch 7"):
            await lease_complete(conn, lease_id=lease_id, epoch=7, outcome="succeeded",
                                 message=None, now=NOW, instance_ids=None)
    assert await _cpu_reserved(db) == 500


async def test_fencing_refuses_the_stale_runtime_after_recovery_and_regrant(
    db: Database,
) -> None:
    (task_id,) = await _placed(db)
    old_lease, old_epoch = await _lease_of(db, task_id)
    expired_at = NOW + timedelta(seconds=TTL + 1)
    async with db.transaction() as conn:
        recovered = await leases_expired_recover(conn, now=expired_at)
        await heartbeat_add(conn, "rt-p1", at=expired_at)  # the runtime is back, late
    assert recovered.requeued == 1
    result = await Reconciler(db, ReconcilerConfig(), owner_id="t2", slots=ALL).run_once(
        now=NOW + timedelta(seconds=TTL + 2)
    )
    assert result.leased == 1
    new_lease, new_epoch = await _lease_of(db, task_id)
    assert new_epoch == old_epoch + 1 and new_lease != old_lease

    async with db.connection() as conn:
        with pytest.raises(LeaseStale) as caught:
            await lease_complete(conn, lease_id=old_lease, epoch=old_epoch, outcome="succeeded",
                                 message=None, now=expired_at, instance_ids=None)
        assert caught.value.status == 409
        with pytest.raises(LeaseStale, match="stale epoch"):
            await lease_complete(conn, lease_id=new_lease, epoch=old_epoch, outcome="succeeded",
                                 message=None, now=expired_at, instance_ids=None)
    async with db.transaction() as conn:
        out = await lease_complete(conn, lease_id=new_lease, epoch=new_epoch,
                                   outcome="succeeded", message=None, now=expired_at,
                                   instance_ids=None)
    assert out["state"] == "SUCCEEDED"
    assert await ledger_violations(db) == []


async def test_cancel_leased_task_releases_capacity_and_ends_the_lease(db: Database) -> None:
    (task_id,) = await _placed(db)
    lease_id, _ = await _lease_of(db, task_id)
    async with db.transaction() as conn:
        assert await task_cancel(conn, task_id=task_id, tenant_id="t1", now=NOW) == "CANCELLED"
    assert await _cpu_reserved(db) == 0
    async with db.connection() as conn:
        state = await conn.fetchval("SELECT state FROM leases WHERE id = $1", lease_id)
    assert state == "CANCELLED"
    async with db.connection() as conn:
        with pytest.raises(TaskNotCancellable):
            await task_cancel(conn, task_id=task_id, tenant_id="t1", now=NOW)
        with pytest.raises(LeaseStale):
            await lease_complete(conn, lease_id=lease_id, epoch=1, outcome="succeeded",
                                 message=None, now=NOW, instance_ids=None)
    assert await ledger_violations(db) == []


async def test_cancel_hides_other_tenants_tasks(db: Database) -> None:
    async with db.transaction() as conn:
        (task_id,) = await tasks_add(conn, tenant="t1")
    async with db.connection() as conn:
        with pytest.raises(TaskNotFound):
            await task_cancel(conn, task_id=task_id, tenant_id="t2", now=NOW)
        with pytest.raises(TaskNotFound):
            await task_cancel(conn, task_id=uuid.uuid4(), tenant_id="t1", now=NOW)


async def _claimable(db: Database) -> uuid.UUID:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=500))
    return task_id


async def _cancel(db: Database, task_id: uuid.UUID) -> str:
    async with db.transaction() as conn:
        return await task_cancel(conn, task_id=task_id, tenant_id="t1", now=NOW)


async def test_cancel_waits_for_the_pass_placing_the_task_then_cancels_it(
    db: Database,
) -> None:
    """The pass's row lock is its claim: a cancel waits for the pass to commit, then ends
    the lease the pass granted and releases its capacity."""
    from app.ledger.claims import Grant, tasks_claim, tasks_lease
    from app.ledger.reservations import ledger_reserve_many

    task_id = await _claimable(db)
    async with db.transaction() as conn:
        claimed = await tasks_claim(conn, slots=ALL, batch=10, now=NOW)
        assert [c.id for c in claimed] == [task_id]
        cancel = asyncio.create_task(_cancel(db, task_id))
        await asyncio.sleep(0.2)
        assert not cancel.done()  # waiting for the pass's lock
        await tasks_lease(
            conn, now=NOW, lease_ttl_seconds=TTL,
            grants=[Grant(task_id, placement_on("p1"), (("p1", 1, "rt-p1"),), (500, 0, 0))],
        )
        await ledger_reserve_many(conn, amounts={"p1": (500, 0, 0)}, now=NOW)
    assert await cancel == "CANCELLED"
    async with db.connection() as conn:
        assert (await task_get(conn, task_id))["state"] == "CANCELLED"
        assert await conn.fetchval("SELECT state FROM leases") == "CANCELLED"
    assert await _cpu_reserved(db) == 0
    assert await ledger_violations(db) == []


async def test_cancel_of_a_task_held_too_long_answers_retry_later(db: Database) -> None:
    from app.ledger.claims import tasks_claim
    from app.ledger.leases import TaskBeingScheduled

    task_id = await _claimable(db)
    async with db.transaction() as conn:
        await tasks_claim(conn, slots=ALL, batch=10, now=NOW)
        with pytest.raises(TaskBeingScheduled) as refused:
            await _cancel(db, task_id)
    assert refused.value.status == 409
    assert refused.value.extra["headers"] == {"Retry-After": "1"}
    # The pass ended without placing it: the cancel goes through now.
    assert await _cancel(db, task_id) == "CANCELLED"
    assert await ledger_violations(db) == []


async def test_revoke_requeues_every_task_leased_on_the_pool(db: Database) -> None:
    ids = await _placed(db, count=2, cpu=400)
    async with db.transaction() as conn:
        assert await pool_leases_revoke(conn, pool_id="p1", now=NOW) == 2
        assert await pool_leases_revoke(conn, pool_id="p1", now=NOW) == 0
    async with db.connection() as conn:
        tasks = [await task_get(conn, i) for i in ids]
        states = {r[0] for r in await conn.fetch("SELECT state FROM leases")}
    assert [(t["state"], t["attempts"]) for t in tasks] == [("ADMITTED", 1), ("ADMITTED", 1)]
    assert states == {"REVOKED"}
    assert await _cpu_reserved(db) == 0
    assert await ledger_violations(db) == []


async def test_lease_ids_are_distinct_uuid7_of_the_pass_millisecond(db: Database) -> None:
    """A lease's id is a UUIDv7 of the pass's millisecond; the leases of one statement (a
    task on two pools included) and of two statements of the same millisecond are distinct."""
    from app.ledger.claims import Grant, tasks_claim, tasks_lease

    async with db.transaction() as conn:
        for pool in ("p1", "p2"):
            await pool_add(conn, pool, tenants=["t1"], capacity=(4000, 4000, 0))
            await heartbeat_add(conn, f"rt-{pool}", at=NOW)
        ids = await tasks_add(conn, tenant="t1", count=4, spec=spec_make(cpu=100))
    for half in (ids[:2], ids[2:]):  # two statements, the same ``now``
        async with db.transaction() as conn:
            claimed = await tasks_claim(conn, slots=ALL, batch=2, now=NOW)
            assert sorted(c.id for c in claimed) == sorted(half)
            members = (("p1", 1, "rt-p1"), ("p2", 1, "rt-p2"))
            await tasks_lease(conn, now=NOW, lease_ttl_seconds=TTL, grants=[
                Grant(c.id, placement_on("p1"), members, (100, 0, 0)) for c in claimed
            ])
    async with db.connection() as conn:
        leases = [r[0] for r in await conn.fetch("SELECT id FROM leases")]
    assert len(leases) == len(set(leases)) == 8
    ms = int(NOW.timestamp() * 1000)
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in leases)
    assert {i.int >> 80 for i in leases} == {ms}


@pytest.mark.parametrize("instances", [("rt-p1", "rt-p2"), ("rt,1", "rt\x1e2")])
async def test_lease_writes_each_member_instance_as_given(
    db: Database, instances: tuple[str, str]
) -> None:
    """Each lease names the runtime instance its member row was granted on, whatever that
    instance's text (the statement's delimiter included)."""
    from app.ledger.claims import Grant, tasks_claim, tasks_lease

    async with db.transaction() as conn:
        for pool in ("p1", "p2"):
            await pool_add(conn, pool, tenants=["t1"], capacity=(4000, 4000, 0))
        ids = await tasks_add(conn, tenant="t1", count=2, spec=spec_make(cpu=100))
    async with db.transaction() as conn:
        claimed = await tasks_claim(conn, slots=ALL, batch=2, now=NOW)
        members = (("p1", 1, instances[0]), ("p2", 2, instances[1]))
        await tasks_lease(conn, now=NOW, lease_ttl_seconds=TTL, grants=[
            Grant(claimed[0].id, placement_on("p1"), members, (100, 0, 0)),
            Grant(claimed[1].id, placement_on("p2"), members[1:], (100, 0, 0)),
        ])
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT l.task_id, l.pool_id, l.runtime_instance_id, r.members FROM leases l "
            "JOIN reservations r ON r.task_id = l.task_id AND r.pool_id = l.pool_id"
        )
    assert sorted((r[0], r[1], r[2], r[3]) for r in rows) == sorted([
        (claimed[0].id, "p1", instances[0], 1), (claimed[0].id, "p2", instances[1], 2),
        (claimed[1].id, "p2", instances[1], 2),
    ])
    assert sorted(ids) == sorted(c.id for c in claimed)
