"""Reclaim through the reconciler on a real database: a tenant back under its nominal takes
back exactly the borrowed work it needs from its cohort, never across cohorts, never a
lease younger than the minimum runtime, never pushing a victim tenant below its nominal;
its victims are requeued without using an attempt and then wait for quota."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.invariants import ledger_check
from app.ledger.leases import lease_complete, runtime_heartbeat
from app.ledger.tenants import Quota, tenant_put
from app.metrics import RECLAIMS
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, heartbeat_add, ledger_violations, pool_add, spec_make, tasks_add

ALL = frozenset(range(SHARD_SLOTS))
CPU = spec_make(cpu=1000)


def reconciler(db: Database, **config: float) -> Reconciler:
    config.setdefault("preemption_grace_seconds", 30.0)
    return Reconciler(db, ReconcilerConfig(**config), owner_id="reclaim", slots=ALL)  # type: ignore[arg-type]


async def setup(db: Database, tenants: dict[str, tuple[str, int | None]], *,
                pools: int = 1) -> None:
    """Pools p0.. of 4 cores open to ``tenants`` ({tenant: (cohort, cpu nominal or None)})."""
    async with db.transaction() as conn:
        for i in range(pools):
            await pool_add(conn, f"p{i}", tenants=list(tenants), capacity=(4000, 8192, 0))
            await heartbeat_add(conn, f"rt-p{i}", at=NOW)
        for name, (cohort, nominal) in tenants.items():
            quotas = {} if nominal is None else {
                "standard": {"cpuMillis": Quota(nominal, None, None)}}
            await tenant_put(conn, tenant_id=name, cohort=cohort, fair_weight=1.0,
                             quotas=quotas, now=NOW)


async def add(db: Database, tenant: str, count: int, **spec: object) -> list[uuid.UUID]:
    async with db.transaction() as conn:
        return await tasks_add(conn, tenant=tenant, count=count,
                               spec=spec_make(**{"cpu": 1000, **spec}))  # type: ignore[arg-type]


async def rows(db: Database, ids: list[uuid.UUID]) -> list[tuple[str, str | None, int]]:
    """(state, pending code, attempts) of each task, with its lease state when leased (a
    gang's leases, one a pool, change state together)."""
    async with db.connection() as conn:
        out = []
        for task_id in ids:
            r = await conn.fetchrow(
                "SELECT t.state, t.pending_reason ->> 'code', t.attempts, "
                "(SELECT min(l.state) FROM leases l WHERE l.task_id = t.id "
                "AND l.state IN ('ACTIVE', 'REVOKING')) FROM tasks t WHERE t.id = $1", task_id)
            out.append((r[3] or r[0], r[1], int(r[2])))
    return out


async def used(db: Database) -> dict[str, int]:
    async with db.connection() as conn:
        return {r[0]: int(r[1]) for r in await conn.fetch(
            "SELECT tenant_id, used FROM quota_usage WHERE resource = 'cpuMillis'")}


async def sound(db: Database) -> None:
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}


async def release_revoking(db: Database, at: datetime) -> list[uuid.UUID]:
    """The runtime gives back every revoking lease at once (outcome released; one lease of a
    gang ends them all)."""
    async with db.transaction() as conn:
        leases = await conn.fetch("SELECT DISTINCT ON (task_id) id, epoch, task_id FROM leases "
                                  "WHERE state = 'REVOKING' ORDER BY task_id, id")
    for lease_id, epoch, _ in leases:
        async with db.transaction() as conn:
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="released",
                                 message=None, now=at)
    return [r[2] for r in leases]


async def test_reclaim_takes_exactly_the_borrowed_work_needed(db: Database) -> None:
    await setup(db, {"a": ("c", 2000), "b": ("c", 2000)})
    a = await add(db, "a", 4)
    assert (await reconciler(db).run_once(now=NOW)).leased == 4
    async with db.transaction() as conn:
        # a's leases in order: the newest is the first victim.
        for i, task_id in enumerate(a):
            await conn.execute("UPDATE tasks SET leased_at = $2 WHERE id = $1", task_id,
                               NOW + timedelta(seconds=i))
    assert await used(db) == {"a": 4000, "b": 0}
    started = RECLAIMS.labels(outcome="started")._value.get()

    b = await add(db, "b", 1)
    at = NOW + timedelta(seconds=10)
    result = await reconciler(db).run_once(now=at)
    assert result.reclaims["started"] == 1 and result.reclaim_victims == 1
    assert result.preempting == 0
    assert RECLAIMS.labels(outcome="started")._value.get() == started + 1
    assert await rows(db, a) == [("ACTIVE", None, 0)] * 3 + [("REVOKING", None, 0)]
    async with db.connection() as conn:
        reason = await conn.fetchval("SELECT pending_reason FROM tasks WHERE id = $1", b[0])
    assert reason["code"] == "reclaiming"
    assert reason["victimIds"] == [str(a[3])]
    await sound(db)

    # The runtime releases at once: b's capacity is handed over and it leases next pass,
    # well within the grace period.
    assert await release_revoking(db, at + timedelta(seconds=1)) == [a[3]]
    await sound(db)
    assert (await reconciler(db).run_once(now=at + timedelta(seconds=2))).leased == 1
    assert (await rows(db, b)) == [("ACTIVE", None, 0)]
    # The victim is back in the queue without using an attempt, waiting for quota: a is at
    # its nominal and b uses its own.
    assert (await rows(db, a))[3] == ("ADMITTED", "quota_borrow_unavailable", 0)
    assert await used(db) == {"a": 3000, "b": 1000}
    async with db.connection() as conn:
        events = [(r[0], r[1]) for r in await conn.fetch(
            "SELECT reason, detail FROM task_events WHERE task_id = $1 ORDER BY id", a[3])]
        preemptions = await conn.fetchval("SELECT preemptions FROM tasks WHERE id = $1", a[3])
    assert [e for e, _ in events][-3:] == ["revoking", "reclaimed", "quota_borrow_unavailable"]
    assert events[-2][1]["preemptorId"] == str(b[0])
    assert preemptions == 1
    await sound(db)


async def test_reclaim_never_pushes_a_victim_below_its_nominal(db: Database) -> None:
    await setup(db, {"a": ("c", 3000), "b": ("c", 1000)}, pools=1)
    a = await add(db, "a", 4)
    assert (await reconciler(db).run_once(now=NOW)).leased == 4
    # a borrows 1000 of b's nominal. b asks for 2000 (1000 more than its nominal): its second
    # task is not within its nominal and reclaims nothing; its first takes one lease back.
    b = await add(db, "b", 2)
    result = await reconciler(db).run_once(now=NOW + timedelta(seconds=1))
    assert result.reclaims["started"] == 1
    got = await rows(db, a)
    assert [s for s, _, _ in got].count("REVOKING") == 1
    assert [c for _, c, _ in await rows(db, b)] == ["reclaiming", "insufficient_cpu"]
    await release_revoking(db, NOW + timedelta(seconds=2))
    await reconciler(db).run_once(now=NOW + timedelta(seconds=3))
    assert await used(db) == {"a": 3000, "b": 1000}
    await sound(db)
    # a at its nominal: nothing more is taken from it, however long b waits.
    result = await reconciler(db).run_once(now=NOW + timedelta(seconds=4))
    assert not result.reclaims.get("started")
    assert await used(db) == {"a": 3000, "b": 1000}


async def test_victims_budget_spans_a_pass_and_takes_no_lease_twice(db: Database) -> None:
    """Four tasks of b in one pass take four leases of a: each reclaim counts the ones before
    it, and a stays at exactly its nominal."""
    await setup(db, {"a": ("c", 4000), "b": ("c", 4000)}, pools=2)
    a = await add(db, "a", 8)
    assert (await reconciler(db).run_once(now=NOW)).leased == 8
    b = await add(db, "b", 5)
    result = await reconciler(db).run_once(now=NOW + timedelta(seconds=1))
    assert result.reclaims["started"] == 4
    assert [s for s, _, _ in await rows(db, a)].count("REVOKING") == 4
    assert sorted(c or "" for _, c, _ in await rows(db, b)) == [
        "insufficient_cpu", "reclaiming", "reclaiming", "reclaiming", "reclaiming"]
    # A second pass takes nothing more: the revoking leases are given back already.
    async with db.transaction() as conn:
        await conn.execute("UPDATE tasks SET parked = false")
    result = await reconciler(db).run_once(now=NOW + timedelta(seconds=2))
    assert not result.reclaims.get("started")
    assert [s for s, _, _ in await rows(db, a)].count("REVOKING") == 4
    await release_revoking(db, NOW + timedelta(seconds=3))
    assert (await reconciler(db).run_once(now=NOW + timedelta(seconds=4))).leased == 4
    assert await used(db) == {"a": 4000, "b": 4000}
    await sound(db)


async def test_no_reclaim_across_cohorts(db: Database) -> None:
    # a borrows all of lender's nominal (cohort c); b has a nominal of its own in cohort d.
    await setup(db, {"a": ("c", 0), "lender": ("c", 4000), "b": ("d", 2000)})
    a = await add(db, "a", 4)
    assert (await reconciler(db).run_once(now=NOW)).leased == 4
    b = await add(db, "b", 1)
    result = await reconciler(db).run_once(now=NOW + timedelta(seconds=1))
    assert result.reclaims["unavailable"] == 1 and not result.reclaims.get("started")
    assert await rows(db, b) == [("ADMITTED", "insufficient_cpu", 0)]
    assert [s for s, _, _ in await rows(db, a)] == ["ACTIVE"] * 4
    # The lender of a's own cohort takes its nominal back.
    mine = await add(db, "lender", 1)
    result = await reconciler(db).run_once(now=NOW + timedelta(seconds=2))
    assert result.reclaims["started"] == 1
    assert (await rows(db, mine))[0][1] == "reclaiming"
    await sound(db)


async def test_no_reclaim_of_a_lease_younger_than_the_minimum_runtime(db: Database) -> None:
    await setup(db, {"a": ("c", 0), "b": ("c", 4000)})
    a = await add(db, "a", 4)
    assert (await reconciler(db).run_once(now=NOW)).leased == 4
    b = await add(db, "b", 1)
    later = NOW + timedelta(seconds=59)
    async with db.transaction() as conn:
        await runtime_heartbeat(conn, instance_id="rt-p0", now=later, lease_ttl_seconds=600)
    result = await reconciler(db, reclaim_min_runtime_seconds=60).run_once(now=later)
    assert result.reclaims["unavailable"] == 1
    assert await rows(db, b) == [("ADMITTED", "insufficient_cpu", 0)]
    later = NOW + timedelta(seconds=60)
    async with db.transaction() as conn:
        await runtime_heartbeat(conn, instance_id="rt-p0", now=later, lease_ttl_seconds=600)
        await conn.execute("UPDATE tasks SET parked = false")
    result = await reconciler(db, reclaim_min_runtime_seconds=60).run_once(now=later)
    assert result.reclaims["started"] == 1
    assert [s for s, _, _ in await rows(db, a)].count("REVOKING") == 1
    await sound(db)


async def test_a_reclaim_victim_revoked_at_the_deadline(db: Database) -> None:
    """A runtime that does not stop in time: the leader revokes at the deadline, the victim is
    requeued with a ``reclaimed`` event and no attempt used, and the reclaimer leases."""
    await setup(db, {"a": ("c", 3000), "b": ("c", 1000)})
    a = await add(db, "a", 4)
    assert (await reconciler(db).run_once(now=NOW)).leased == 4
    b = await add(db, "b", 1)
    rec = reconciler(db, preemption_grace_seconds=5)
    assert (await rec.run_once(now=NOW + timedelta(seconds=1))).reclaims["started"] == 1
    deadline = NOW + timedelta(seconds=7)
    async with db.transaction() as conn:
        await runtime_heartbeat(conn, instance_id="rt-p0", now=deadline, lease_ttl_seconds=600)
    assert await rec.recover_once(now=deadline) >= 1
    assert (await rec.run_once(now=deadline)).leased == 1
    victim = next(t for t, r in zip(a, await rows(db, a), strict=True) if r[0] == "ADMITTED")
    async with db.connection() as conn:
        reasons = [r[0] for r in await conn.fetch(
            "SELECT reason FROM task_events WHERE task_id = $1 ORDER BY id", victim)]
    assert "reclaimed" in reasons and "preempted" not in reasons
    assert await rows(db, b) == [("ACTIVE", None, 0)]
    await sound(db)


async def _leased_at(db: Database, ids: list[uuid.UUID]) -> None:
    """Lease times in order: the later in ``ids``, the more recent (the first victims)."""
    async with db.transaction() as conn:
        for i, task_id in enumerate(ids):
            await conn.execute("UPDATE tasks SET leased_at = $2 WHERE id = $1", task_id,
                               NOW + timedelta(seconds=i))


async def test_a_gang_of_four_reclaims_on_two_pools_for_all_its_members(db: Database) -> None:
    """A gang of 4 (at most 2 a pool) within b's nominal takes back 2 borrowed leases of a on
    each of two pools at once, then leases on both after the runtime releases them; the
    victims go back to the queue without using an attempt."""
    await setup(db, {"a": ("c", 4000), "b": ("c", 4000)}, pools=2)
    a = await add(db, "a", 8)
    assert (await reconciler(db).run_once(now=NOW)).leased == 8
    await _leased_at(db, a)
    assert await used(db) == {"a": 8000, "b": 0}
    async with db.transaction() as conn:
        (gang,) = await tasks_add(conn, tenant="b", spec=spec_make(
            cpu=1000, gang={"members": 4, "maxPerPool": 2}))  # type: ignore[arg-type]
    at = NOW + timedelta(seconds=10)
    result = await reconciler(db).run_once(now=at)
    assert result.reclaims["started"] == 1 and result.reclaim_victims == 4
    revoking = [t for t, r in zip(a, await rows(db, a), strict=True) if r[0] == "REVOKING"]
    assert len(revoking) == 4
    async with db.connection() as conn:
        reason = await conn.fetchval("SELECT pending_reason FROM tasks WHERE id = $1", gang)
        pools = await conn.fetch("SELECT pool_id, count(*) FROM reservations WHERE task_id = "
                                 "ANY($1::uuid[]) GROUP BY 1 ORDER BY 1", revoking)
    assert reason["code"] == "reclaiming" and reason["victims"] == 4
    assert sorted(reason["poolIds"]) == ["p0", "p1"]
    assert [(p, int(n)) for p, n in pools] == [("p0", 2), ("p1", 2)]
    await sound(db)

    assert sorted(await release_revoking(db, at + timedelta(seconds=1))) == sorted(revoking)
    await sound(db)
    assert (await reconciler(db).run_once(now=at + timedelta(seconds=2))).leased == 1
    assert await rows(db, [gang]) == [("ACTIVE", None, 0)]
    async with db.connection() as conn:
        members = await conn.fetch("SELECT pool_id, members FROM reservations "
                                   "WHERE task_id = $1 AND NOT hold ORDER BY 1", gang)
    assert [(p, int(m)) for p, m in members] == [("p0", 2), ("p1", 2)]
    # The victims are requeued with no attempt used and wait for quota: a is at its nominal.
    got = dict(zip(a, await rows(db, a), strict=True))
    assert [got[t] for t in revoking] == [("ADMITTED", "quota_borrow_unavailable", 0)] * 4
    assert await used(db) == {"a": 4000, "b": 4000}
    async with db.connection() as conn:
        for t in revoking:
            events = await conn.fetch("SELECT reason, detail FROM task_events "
                                      "WHERE task_id = $1 ORDER BY id", t)
            assert events[-2][0] == "reclaimed"
            assert events[-2][1]["preemptorId"] == str(gang)
    await sound(db)



@pytest.mark.parametrize(("nominal", "whole"), [(4000, True), (5000, False)])
async def test_a_borrowed_gang_is_taken_whole_or_not_at_all(
    db: Database, nominal: int, whole: bool
) -> None:
    """A borrowed gang is one victim: taken whole (the leases of all its members revoked
    together) only while its tenant stays at or above its nominal, else other work is."""
    await setup(db, {"a": ("c", nominal), "b": ("c", 4000)}, pools=2)
    async with db.transaction() as conn:
        (gang,) = await tasks_add(conn, tenant="a", spec=spec_make(
            cpu=2000, gang={"members": 2, "maxPerPool": 1}))  # type: ignore[arg-type]
    assert (await reconciler(db).run_once(now=NOW)).leased == 1
    # The gang (priority 0, one member a pool) is cheaper to take than two singles (1).
    singles = await add(db, "a", 4, priority=1)
    assert (await reconciler(db).run_once(now=NOW)).leased == 4
    assert await used(db) == {"a": 8000, "b": 0}
    b = await add(db, "b", 1, cpu=2000)
    at = NOW + timedelta(seconds=1)
    assert (await reconciler(db).run_once(now=at)).reclaims["started"] == 1
    async with db.connection() as conn:
        gang_leases = sorted(r[0] for r in await conn.fetch(
            "SELECT state FROM leases WHERE task_id = $1 AND state IN ('ACTIVE', 'REVOKING')",
            gang))
        taken = await conn.fetch(
            "SELECT r.task_id, r.pool_id FROM leases l JOIN reservations r ON r.task_id = "
            "l.task_id AND r.pool_id = l.pool_id AND NOT r.hold WHERE l.state = 'REVOKING'")
    if whole:
        # a borrows 4000: the gang (4000 in all) is taken, on both of its pools at once.
        assert gang_leases == ["REVOKING", "REVOKING"]
        assert sorted(p for _, p in taken) == ["p0", "p1"]
        assert {t for t, _ in taken} == {gang}
    else:
        # a borrows 3000 only: taking the gang would put it below its nominal; two singles
        # on one pool are taken instead and the gang keeps running everywhere.
        assert gang_leases == ["ACTIVE", "ACTIVE"]
        assert len(taken) == 2 and len({p for _, p in taken}) == 1
        assert {t for t, _ in taken} <= set(singles)
    await sound(db)
    await release_revoking(db, at + timedelta(seconds=1))
    assert (await reconciler(db).run_once(now=at + timedelta(seconds=2))).leased == 1
    assert await rows(db, b) == [("ACTIVE", None, 0)]
    assert await used(db) == {"a": 8000 - 2000 * (2 if whole else 1), "b": 2000}
    if whole:
        async with db.connection() as conn:
            state, attempts = await conn.fetchrow(
                "SELECT state, attempts FROM tasks WHERE id = $1", gang)
        assert (state, attempts) == ("ADMITTED", 0)
    await sound(db)
