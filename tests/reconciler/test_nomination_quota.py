"""A nominee its own quota now refuses gives its holds back in the same pass.

Tenant a's 3-core task is nominated on q1 (4000m); then a borrows on q2 up to what its
cohort can lend, so the task's quota refuses it (``quota_borrow_unavailable``). The pass
that places a's borrowing work (after the nominee, in the same pass) ends the nomination,
hands it back pending for its quota, and gives back what it held on q1; another cohort's
1-core tasks, decided in that pass while q1 was still held, place there in the next one.
"""

from __future__ import annotations

import uuid

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.tenants import Quota, tenant_put
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, pool_add, spec_make, sweep_and_pass, tasks_add

ALL = frozenset(range(SHARD_SLOTS))
RUNTIMES = ("rt-q1", "rt-q2")


def on(zone: str, cpu: int) -> dict:
    return spec_make(cpu=cpu, constraints={"poolSelector": {"zone": zone}})


async def add(db: Database, tenant: str, spec: dict, count: int = 1) -> list[uuid.UUID]:
    async with db.transaction() as conn:
        return await tasks_add(conn, tenant=tenant, spec=spec, count=count)


async def quota(db: Database, tenant: str, cohort: str, nominal: int) -> None:
    async with db.transaction() as conn:
        await tenant_put(conn, tenant_id=tenant, cohort=cohort, fair_weight=1.0,
                         quotas={"standard": {"cpuMillis": Quota(nominal, None, None)}}, now=NOW)


async def state(db: Database, task_id: uuid.UUID) -> tuple[str, str | None, int, int]:
    """(state, pending code, cpu it reserves or holds, nominated pools) of a task."""
    async with db.connection() as conn:
        r = await conn.fetchrow(
            "SELECT t.state, t.pending_reason ->> 'code', "
            "(SELECT coalesce(sum(cpu), 0) FROM reservations WHERE task_id = t.id), "
            "(SELECT count(*) FROM nominations WHERE task_id = t.id) FROM tasks t "
            "WHERE t.id = $1", task_id)
    return r[0], r[1], int(r[2]), int(r[3])


async def test_a_nominee_its_quota_refuses_gives_back_its_holds_in_one_pass(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "q1", tenants=["a", "b"], capacity=(4000, 8192, 0),
                       labels={"zone": "one"})
        await pool_add(conn, "q2", tenants=["a", "b"], capacity=(2000, 8192, 0),
                       labels={"zone": "two"})
    await quota(db, "a", "ca", 0)
    await quota(db, "b", "cb", 16000)
    rec = Reconciler(db, ReconcilerConfig(nomination_seconds=60), owner_id="nq", slots=ALL)

    # a's big task waits (its cohort lends nothing yet) while b's work, behind it, fills q1.
    (big,) = await add(db, "a", spec_make(cpu=3000))
    await add(db, "b", on("one", 1000), count=2)
    await sweep_and_pass(db, rec, 0, instances=RUNTIMES)
    assert (await state(db, big))[:2] == ("ADMITTED", "quota_borrow_unavailable")
    # A lender joins a's cohort: the task fits its quota, but no pool has 3 cores free.
    await quota(db, "lender", "ca", 4000)
    await sweep_and_pass(db, rec, 10, instances=RUNTIMES)
    assert (await state(db, big))[:2] == ("ADMITTED", "insufficient_cpu")
    # Starving past the nomination time, it is nominated on q1 and holds q1's free 2000m.
    await sweep_and_pass(db, rec, 400, instances=RUNTIMES)
    assert await state(db, big) == ("ADMITTED", "nominated", 2000, 1)

    # a borrows 2000m on q2: what its cohort can lend now falls short of the big task.
    small_a = await add(db, "a", on("two", 1000), count=2)
    waiting_b = await add(db, "b", on("one", 1000), count=2)
    await sweep_and_pass(db, rec, 410, instances=RUNTIMES)
    assert [(await state(db, t))[0] for t in small_a] == ["LEASED", "LEASED"]
    # Decided before a's small tasks were placed, the big task is refused once they are:
    # its nomination ends and its holds go back in that same pass.
    assert await state(db, big) == ("ADMITTED", "quota_borrow_unavailable", 0, 0)
    assert [(await state(db, t))[0] for t in waiting_b] == ["ADMITTED", "ADMITTED"]

    # b's tasks place on q1, freed.
    await sweep_and_pass(db, rec, 420, instances=RUNTIMES)
    assert await state(db, big) == ("ADMITTED", "quota_borrow_unavailable", 0, 0)
    assert [(await state(db, t))[0] for t in waiting_b] == ["LEASED", "LEASED"]
