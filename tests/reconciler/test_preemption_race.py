"""Race: four reconcilers, preemptors of several priorities, runtimes that answer and ones
that never do — the ledger always equals the live reservations and no task is lost."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.leases import lease_complete
from app.reconciler import Reconciler, ReconcilerConfig
from app.reconciler.passes import PassResult
from tests.factories import NOW, ledger_violations, pools_add, spec_make, task_states, tasks_add

pytestmark = pytest.mark.slow

ALL = frozenset(range(SHARD_SLOTS))
TENANTS = [f"tenant-{i}" for i in range(4)]
GRACE = 30.0
#: Capacity held by a task that is not leased and waits for no victim.
STRAY_HOLDS = (
    "SELECT count(*) FROM reservations r JOIN tasks t ON t.id = r.task_id "
    "WHERE t.state <> 'LEASED' AND NOT EXISTS (SELECT 1 FROM leases l "
    "WHERE l.preempted_by = t.id AND l.state = 'REVOKING')"
)


def _config() -> ReconcilerConfig:
    return ReconcilerConfig(batch_size=40, preemption_grace_seconds=GRACE,
                            lease_ttl_seconds=10**6, heartbeat_freshness_seconds=10**6)


async def _complete_some(db: Database, rng: random.Random, at) -> int:
    """Let the runtimes finish about half of the revoking leases on even-numbered pools;
    those of odd-numbered pools never answer (so some victims are always revoked)."""
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT DISTINCT ON (task_id) id, epoch, pool_id FROM leases "
            "WHERE state = 'REVOKING' ORDER BY task_id, pool_id")
    done = 0
    for lease_id, epoch, pool_id in rows:
        if int(pool_id[-1]) % 2 == 0 and rng.random() < 0.5:
            async with db.transaction() as conn:
                await lease_complete(conn, lease_id=lease_id, epoch=epoch,
                                     outcome="succeeded", message=None, now=at)
            done += 1
    return done


async def test_four_reconcilers_with_preemptors_never_double_count_or_lose_a_task(
    db: Database, database_url: str
) -> None:
    rng = random.Random(13)

    async with db.transaction() as conn:
        await pools_add(conn, 20, tenants=TENANTS, capacity=(4000, 8192, 0),
                        heartbeat_at=NOW + timedelta(days=1))
        for tenant in TENANTS:
            await tasks_add(conn, tenant=tenant, count=20, spec=spec_make(cpu=1000))
    databases = [Database(database_url, max_size=4) for _ in range(4)]
    reconcilers = [Reconciler(d, _config(), owner_id=f"racer-{i}", slots=ALL)
                   for i, d in enumerate(databases)]
    try:
        # Phase 1: the low-priority work fills every pool.
        while sum(r.claimed for r in await asyncio.gather(
                *(x.run_once(now=NOW) for x in reconcilers))):
            pass
        assert (await task_states(db)) == {"LEASED": 80}
        assert await ledger_violations(db) == []

        # Phase 2: preemptors of priorities 1..5 (one or two cores, some gangs) and tasks
        # that never preempt.
        async with db.transaction() as conn:
            for tenant in TENANTS:
                specs = [
                    spec_make(cpu=rng.choice((1000, 2000)), priority=rng.randint(1, 5),
                              preemption="lowerPriority")
                    for _ in range(12)
                ]
                specs += [spec_make(cpu=1000, priority=4, preemption="lowerPriority",
                                    gang={"members": 2})] * 2
                specs += [spec_make(cpu=1000, priority=3)] * 4
                await tasks_add(conn, tenant=tenant, specs=specs)
        total = 80 + 4 * 18

        at = NOW
        results: list[PassResult] = []
        completed = 0
        for _ in range(40):
            at += timedelta(seconds=GRACE / 2)
            for r in await asyncio.gather(*(x.run_once(now=at) for x in reconcilers)):
                results.append(r)
            assert await ledger_violations(db) == [], "after racing passes"
            completed += await _complete_some(db, rng, at)
            assert await ledger_violations(db) == [], "after completions"
            await reconcilers[0].recover_once(now=at)
            assert await ledger_violations(db) == [], "after recovery"
            for x in reconcilers:
                await x.unpark(now=at)
            states = await task_states(db)
            assert sum(states.values()) == total  # nothing lost, nothing duplicated
            async with db.connection() as conn:
                revoking = await conn.fetchval(
                    "SELECT count(*) FROM leases WHERE state = 'REVOKING'")
                # A preemptor whose victims all ended gets its pass before the end.
                inheriting = await conn.fetchval(STRAY_HOLDS)
            if not revoking and not inheriting and not states.get("CLAIMED") and all(
                    r.leased == 0 and r.preempting == 0 for r in results[-4:]):
                break
    finally:
        for x in reconcilers:
            await x.close()
        for d in databases:
            await d.close()

    preemptions = sum(r.preempting for r in results)
    print(f"preemptions: {preemptions}, completed within grace: {completed}")
    assert preemptions > 0 and completed > 0
    assert await ledger_violations(db) == []
    states = await task_states(db)
    assert set(states) <= {"LEASED", "ADMITTED", "SUCCEEDED"}
    assert sum(states.values()) == total
    async with db.connection() as conn:
        # Every victim revoked at its deadline came back without using an attempt.
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE attempts > 0") == 0
        revoked = await conn.fetchval("SELECT count(*) FROM tasks WHERE preemptions > 0")
        # Every waiting task says why; no preemptor is left holding capacity it cannot use.
        unexplained = await conn.fetchval(
            "SELECT count(*) FROM tasks WHERE state = 'ADMITTED' AND pending_reason IS NULL "
            "AND parked")
        stray_holds = await conn.fetchval(STRAY_HOLDS)
        # A gang is placed whole or not at all.
        gangs = [r[0] for r in await conn.fetch(
            "SELECT SUM(r.members) FROM reservations r JOIN tasks t ON t.id = r.task_id "
            "WHERE t.spec::jsonb ? 'gang' AND t.state = 'LEASED' GROUP BY t.id")]
        # Every displacement was of a strictly lower priority task of the same tenant.
        wrong = await conn.fetchval(
            "SELECT count(*) FROM task_events e JOIN tasks v ON v.id = e.task_id "
            "JOIN tasks p ON p.id = (e.detail ->> 'preemptorId')::uuid "
            "WHERE e.reason IN ('revoking', 'preempted') "
            "AND (p.tenant_id <> v.tenant_id OR p.priority <= v.priority)")
        displaced = await conn.fetchval(
            "SELECT count(*) FROM task_events WHERE reason = 'revoking'")
    assert revoked > 0
    assert unexplained == 0
    assert stray_holds == 0
    assert set(gangs) <= {2}
    assert wrong == 0 and displaced >= preemptions
