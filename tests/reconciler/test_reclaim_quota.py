"""A waiting reclaimer its own quota now refuses gives its holds back in the same pass.

Tenant b, within its nominal, reclaims a core that tenant a borrows: a's newest lease is
revoked, and once it stops its core is held for b. Before b's next pass, b's nominal is
taken away: its quota refuses the task (a borrows everything the cohort lends), so that
pass hands it back pending for its quota and gives back the core it held, instead of
placing it there.

The quota that refuses a reclaimer may also be another cohort's: in a tree, what one cohort
lends is borrowed through the root by the others. Tenant c (cohort c2) reclaims a's
borrowed work with a task that takes c above its nominal by what the root lends; when a's
nominal (cohort c1) is taken away, the root lends nothing more, and the PUT of a wakes c's
reclaimer too, whose pass gives back what it held.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.leases import lease_complete
from app.ledger.tenants import Quota, tenant_put
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, pool_add, spec_make, sweep_and_pass, tasks_add
from tests.reconciler.holds_world import World

ALL = frozenset(range(SHARD_SLOTS))


async def quota(db: Database, tenant: str, nominal: int) -> None:
    async with db.transaction() as conn:
        await tenant_put(conn, tenant_id=tenant, cohort="c", fair_weight=1.0,
                         quotas={"standard": {"cpuMillis": Quota(nominal, None, None)}}, now=NOW)


async def add(db: Database, tenant: str, count: int) -> list[uuid.UUID]:
    async with db.transaction() as conn:
        return await tasks_add(conn, tenant=tenant, spec=spec_make(cpu=1000), count=count)


async def state(db: Database, task_id: uuid.UUID) -> tuple[str, str | None, int]:
    """(state, pending code, cpu it holds) of a task."""
    async with db.connection() as conn:
        r = await conn.fetchrow(
            "SELECT t.state, t.pending_reason ->> 'code', (SELECT coalesce(sum(cpu), 0) "
            "FROM reservations WHERE task_id = t.id AND hold) FROM tasks t WHERE t.id = $1",
            task_id)
    return r[0], r[1], int(r[2])


async def release_revoking(db: Database, seconds: float) -> int:
    """The runtime gives back every revoking lease; return how many."""
    async with db.connection() as conn:
        leases = await conn.fetch("SELECT id, epoch FROM leases WHERE state = 'REVOKING'")
    for lease_id, epoch in leases:
        async with db.transaction() as conn:
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="released",
                                 message=None, now=NOW + timedelta(seconds=seconds))
    return len(leases)


async def reserved(db: Database) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval("SELECT cpu_reserved FROM ledgers WHERE pool_id = 'p0'"))


async def test_a_reclaimer_its_quota_refuses_gives_back_its_holds_in_one_pass(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p0", tenants=["a", "b"], capacity=(4000, 8192, 0))
    await quota(db, "a", 2000)
    await quota(db, "b", 2000)
    rec = Reconciler(db, ReconcilerConfig(preemption_grace_seconds=600), owner_id="rq",
                     slots=ALL)
    await add(db, "a", 4)
    await sweep_and_pass(db, rec, 0)
    # b asks for a core of its nominal: a's newest lease is revoked for it.
    (b,) = await add(db, "b", 1)
    await sweep_and_pass(db, rec, 10)
    assert await state(db, b) == ("ADMITTED", "reclaiming", 0)
    # The victim stops: its core is held for b.
    assert await release_revoking(db, 11) == 1
    assert await state(db, b) == ("ADMITTED", "reclaiming", 1000)
    assert await reserved(db) == 4000

    # b's nominal is gone: a borrows all the cohort lends, so b's quota refuses the task.
    await quota(db, "b", 0)
    await sweep_and_pass(db, rec, 20)
    assert await state(db, b) == ("ADMITTED", "quota_borrow_unavailable", 0)
    assert await reserved(db) == 3000


async def test_a_quota_put_in_one_cohort_wakes_the_reclaimers_of_its_tree(db: Database) -> None:
    world = World(db)
    try:
        await world.build()  # a runs 6 x 1000m (2000m borrowed), c 3 x 1000m
        await world.status("p0", "CORDONED")
        await world.tick(5)
        await world.submit("c", 2000, 0, False, None, 1)
        await world.tick(5)
        reclaimer = world.tasks[-1]
        assert await state(db, reclaimer) == ("ADMITTED", "reclaiming", 1000)

        assert await world.quota("a", "c1", 0, None)
        # Woken by a's PUT: the pass finds c's quota refusing the task and takes its holds
        # back (the world's checks after the pass find no hold its quota refuses).
        await world.tick(5)
        assert await state(db, reclaimer) == ("ADMITTED", "quota_borrow_unavailable", 0)
    finally:
        await world.rec.close()
