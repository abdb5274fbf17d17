"""Preemption through the reconciler: victims revoke with a grace period, their capacity is
held for the preemptor, and nothing is lost or double-counted."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.leases import LeaseStale, lease_complete, runtime_heartbeat, runtime_leases_list
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import (
    NOW,
    ledger_violations,
    pool_add,
    spec_make,
    task_events,
    task_get,
    tasks_add,
)

ALL = frozenset(range(SHARD_SLOTS))
GRACE = 30.0


def reconciler(db: Database, name: str = "pre") -> Reconciler:
    return Reconciler(db, ReconcilerConfig(preemption_grace_seconds=GRACE), owner_id=name,
                      slots=ALL)


async def _setup(db: Database) -> tuple[list[uuid.UUID], uuid.UUID]:
    """Fill pool p1 (2 cores) with two priority-0 tasks; queue a priority-5 preemptor."""
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(2000, 8192, 0))
        await runtime_heartbeat(conn, instance_id="rt-p1", now=NOW, lease_ttl_seconds=600)
        low = await tasks_add(conn, tenant="t1", count=2, spec=spec_make(cpu=1000))
    assert (await reconciler(db).run_once(now=NOW)).leased == 2
    async with db.transaction() as conn:
        # The newer victim is the one taken (most recently leased wins a tie).
        await conn.execute("UPDATE tasks SET leased_at = leased_at + interval '1 second' "
                           "WHERE id = $1", low[1])
        (pre,) = await tasks_add(conn, tenant="t1", spec=spec_make(
            cpu=1000, priority=5, preemption="lowerPriority"))
    return low, pre


async def _lease(db: Database, task_id: uuid.UUID) -> tuple[uuid.UUID, int, str]:
    async with db.connection() as conn:
        r = await conn.fetchrow("SELECT id, epoch, state FROM leases WHERE task_id = $1 "
                                "ORDER BY granted_at DESC LIMIT 1", task_id)
    return r[0], int(r[1]), r[2]


async def _reserved(db: Database) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval("SELECT cpu_reserved FROM ledgers WHERE pool_id = 'p1'"))


async def _preempt(db: Database) -> tuple[list[uuid.UUID], uuid.UUID, uuid.UUID]:
    low, pre = await _setup(db)
    result = await reconciler(db).run_once(now=NOW)
    assert result.preempting == 1 and result.leased == 0
    victim = low[1]
    task = await task_get_json(db, pre)
    assert task["state"] == "ADMITTED" and task["parked"]
    pending = task["pending_reason"]
    assert pending["code"] == "preempting"
    assert pending["victims"] == 1 and pending["victimIds"] == [str(victim)]
    assert pending["revokeBy"].startswith((NOW + timedelta(seconds=GRACE)).isoformat()[:19])
    # The victim's lease is REVOKING, visible to the runtime; its task is still LEASED.
    lease_id, _, state = await _lease(db, victim)
    assert state == "REVOKING"
    async with db.transaction() as conn:
        listed = await runtime_leases_list(conn, instance_id="rt-p1")
        beat = await runtime_heartbeat(conn, instance_id="rt-p1", now=NOW, lease_ttl_seconds=600)
    assert {(x["taskId"], x["state"]) for x in listed} == {
        (str(low[0]), "ACTIVE"), (str(victim), "REVOKING")}
    assert [r["leaseId"] for r in beat.revoking] == [str(lease_id)]
    assert (await task_get_json(db, victim))["state"] == "LEASED"
    assert ("revoking", {"preemptorId": str(pre), "revokeBy": pending_iso(NOW)}) in [
        (r, d) for r, d in await task_events(db, victim)]
    assert await _reserved(db) == 2000
    assert await ledger_violations(db) == []
    return low, pre, victim


def pending_iso(at) -> str:
    return (at + timedelta(seconds=GRACE)).isoformat()


async def task_get_json(db: Database, task_id: uuid.UUID) -> dict:
    async with db.connection() as conn:
        return await task_get(conn, task_id)


async def test_runtime_completes_before_the_deadline_and_the_preemptor_gets_the_capacity(
    db: Database,
) -> None:
    low, pre, victim = await _preempt(db)
    # Another task of the tenant arrives; the capacity about to be freed is not for it.
    async with db.transaction() as conn:
        (other,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=1000))
    lease_id, epoch, _ = await _lease(db, victim)
    later = NOW + timedelta(seconds=5)
    async with db.transaction() as conn:
        done = await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="succeeded",
                                    message=None, now=later)
    assert done["state"] == "SUCCEEDED"  # a completion within the grace period is honoured
    assert (await task_get_json(db, victim))["state"] == "SUCCEEDED"
    # The victim's capacity is held for the preemptor: still reserved, as its hold.
    assert await _reserved(db) == 2000
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        held = await conn.fetchval("SELECT cpu FROM reservations WHERE task_id = $1", pre)
    assert held == 1000
    assert not (await task_get_json(db, pre))["parked"]

    result = await reconciler(db).run_once(now=later)
    assert result.leased == 1
    assert (await task_get_json(db, pre))["state"] == "LEASED"
    assert (await task_get_json(db, other))["state"] == "ADMITTED"  # nominated: not its
    assert await _reserved(db) == 2000
    assert await ledger_violations(db) == []
    reasons = [r for r, _ in await task_events(db, pre)]
    assert reasons == ["preempting", "leased"]
    preempting = dict(await task_events(db, pre))["preempting"]
    assert preempting["victimIds"] == [str(victim)]


async def test_runtime_never_answers_so_the_victim_is_revoked_fenced_and_requeued(
    db: Database,
) -> None:
    low, pre, victim = await _preempt(db)
    old_lease, old_epoch, _ = await _lease(db, victim)
    rec = reconciler(db)
    # Before the deadline nothing happens.
    assert await rec.recover_once(now=NOW + timedelta(seconds=GRACE - 1)) == 0
    assert (await _lease(db, victim))[2] == "REVOKING"
    after = NOW + timedelta(seconds=GRACE + 1)
    try:
        assert await rec.recover_once(now=after) == 1
    finally:
        await rec.close()
    task = await task_get_json(db, victim)
    assert task["state"] == "ADMITTED" and task["attempts"] == 0 and task["preemptions"] == 1
    assert (await _lease(db, victim))[2] == "REVOKED"
    reason, detail = (await task_events(db, victim))[-1]
    assert reason == "preempted" and detail["preemptorId"] == str(pre)
    assert await _reserved(db) == 2000  # handed over, not released
    assert await ledger_violations(db) == []

    # The late runtime is fenced: its old lease at its old epoch is refused.
    async with db.transaction() as conn:
        with pytest.raises(LeaseStale):
            await lease_complete(conn, lease_id=old_lease, epoch=old_epoch,
                                 outcome="succeeded", message=None, now=after)
        await runtime_heartbeat(conn, instance_id="rt-p1", now=after, lease_ttl_seconds=600)

    result = await reconciler(db).run_once(now=after)
    assert result.leased == 1  # the preemptor; the victim waits for room again
    assert (await task_get_json(db, pre))["state"] == "LEASED"
    victim_task = await task_get_json(db, victim)
    assert victim_task["state"] == "ADMITTED" and victim_task["pending_reason"]
    assert await ledger_violations(db) == []

    # Once room comes back, the victim runs again under a newer epoch.
    lease_id, epoch, _ = await _lease(db, pre)
    async with db.transaction() as conn:
        await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="succeeded",
                             message=None, now=after)
    async with db.connection() as conn:
        await conn.execute("UPDATE tasks SET parked = false WHERE id = $1", victim)
    assert (await reconciler(db).run_once(now=after)).leased == 1
    new_lease, new_epoch, state = await _lease(db, victim)
    assert state == "ACTIVE" and new_lease != old_lease and new_epoch > old_epoch


async def test_a_preemptor_cancelled_while_waiting_gives_everything_back(db: Database) -> None:
    low, pre, victim = await _preempt(db)
    from app.ledger.leases import task_cancel

    async with db.transaction() as conn:
        await task_cancel(conn, task_id=pre, tenant_id="t1", now=NOW)
    lease_id, epoch, _ = await _lease(db, victim)
    async with db.transaction() as conn:
        await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="succeeded",
                             message=None, now=NOW)
    assert await _reserved(db) == 1000  # released to the ledger: nobody inherits it
    assert await ledger_violations(db) == []


async def test_nobody_is_preempted_for_a_task_that_says_never_or_by_another_tenant(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1", "t2"], capacity=(1000, 8192, 0))
        await runtime_heartbeat(conn, instance_id="rt-p1", now=NOW, lease_ttl_seconds=600)
        await tasks_add(conn, tenant="t1", spec=spec_make(cpu=1000))
    assert (await reconciler(db).run_once(now=NOW)).leased == 1
    async with db.transaction() as conn:
        await tasks_add(conn, tenant="t1", spec=spec_make(cpu=1000, priority=9))
        await tasks_add(conn, tenant="t2", spec=spec_make(
            cpu=1000, priority=9, preemption="lowerPriority"))
    result = await reconciler(db).run_once(now=NOW)
    assert result.preempting == 0 and result.pending == 2
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM leases WHERE state = 'REVOKING'") == 0


async def test_a_gang_preempts_for_all_members_on_two_pools(db: Database) -> None:
    async with db.transaction() as conn:
        for p in ("p1", "p2"):
            await pool_add(conn, p, tenants=["t1"], capacity=(1000, 8192, 0))
            await runtime_heartbeat(conn, instance_id=f"rt-{p}", now=NOW,
                                    lease_ttl_seconds=600)
        low = await tasks_add(conn, tenant="t1", count=2, spec=spec_make(cpu=1000))
    assert (await reconciler(db).run_once(now=NOW)).leased == 2
    async with db.transaction() as conn:
        (gang,) = await tasks_add(conn, tenant="t1", spec=spec_make(
            cpu=1000, priority=3, preemption="lowerPriority", gang={"members": 2}))
    assert (await reconciler(db).run_once(now=NOW)).preempting == 1
    async with db.connection() as conn:
        revoking = await conn.fetchval(
            "SELECT count(DISTINCT task_id) FROM leases WHERE state = 'REVOKING' "
            "AND preempted_by = $1", gang)
    assert revoking == 2
    after = NOW + timedelta(seconds=GRACE + 1)
    rec = reconciler(db)
    try:
        await rec.recover_once(now=after)
    finally:
        await rec.close()
    async with db.transaction() as conn:
        for p in ("p1", "p2"):
            await runtime_heartbeat(conn, instance_id=f"rt-{p}", now=after,
                                    lease_ttl_seconds=600)
    assert (await reconciler(db).run_once(now=after)).leased == 1
    task = await task_get_json(db, gang)
    assert task["state"] == "LEASED"
    assert sorted(m["poolId"] for m in task["placement"]["members"]) == ["p1", "p2"]
    assert {(await task_get_json(db, t))["state"] for t in low} == {"ADMITTED"}
    assert await ledger_violations(db) == []


async def test_a_reconciler_killed_mid_preemption_leaves_nothing_half_done(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    low, pre = await _setup(db)
    import app.ledger.plans as plans

    class Killed(BaseException):
        """The process dies after the victims were revoked, before COMMIT."""

    async def die(*args, **kwargs):
        raise Killed()

    monkeypatch.setattr(plans, "ledger_reserve_many", die)
    with pytest.raises(Killed):
        await reconciler(db, "doomed").run_once(now=NOW)
    monkeypatch.undo()
    # Nothing of the torn pass is visible: no revoking lease, no hold, the task admitted
    # and claimable again at once (its claim was the row lock of the aborted transaction).
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM leases WHERE state = 'REVOKING'") == 0
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE task_id = $1",
                                   pre) == 0
    assert (await task_get_json(db, pre))["state"] == "ADMITTED"
    assert await ledger_violations(db) == []

    # Another reconciler takes the task over and preempts exactly once.
    later = NOW + timedelta(seconds=1)
    async with db.transaction() as conn:
        await runtime_heartbeat(conn, instance_id="rt-p1", now=later, lease_ttl_seconds=600)
    result = await reconciler(db, "survivor").run_once(now=later)
    assert result.preempting == 1
    async with db.connection() as conn:
        assert await conn.fetchval(
            "SELECT count(DISTINCT task_id) FROM leases WHERE state = 'REVOKING'") == 1
    assert await _reserved(db) == 2000
    assert await ledger_violations(db) == []
