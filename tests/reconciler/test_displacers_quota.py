"""A preemptor and a reclaimer of one tenant never take it past its quota together.

Tenant a (nominal 6000m) runs one 2000m low-priority task; tenant b (nominal 2000m, same
cohort) borrows 4000m of a's nominal with three 2000m tasks; 2000m of the pool is free.
a's 4000m high-priority task preempts a's own 2000m lease and holds the free 2000m: once
it is placed, a uses 4000m. Then a asks for another 4000m. With the preemptor's need
counted as a's usage (and its victim's usage given back once), a would use 8000m of its
6000m nominal and b lends nothing: the task waits for a's quota, b keeps its leases, and
the preemptor is placed once its victim stops. Were the preemptor's need left out, the
second task would see a's nominal free and reclaim b's two borrowed leases; once those
stopped, the high-priority preemptor, judged with the reclaimer counted, would give its
holds back to wait for a's quota, and b would have lost its work to a's low-priority task.
The same holds when both tasks are decided in one pass: the preemption planned first counts
in the pass's own book.

The victims' usage is given back once: when a's preemptor needs no more than its victim
frees, a's other 4000m task still sees a's nominal as it will be (2000m for the preemptor,
4000m left), not with the victim and the preemptor both counted, and reclaims b's borrowed
leases.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.leases import lease_complete
from app.ledger.snapshot import SnapshotCache
from app.ledger.tenants import Quota, tenant_put
from app.reconciler import Reconciler, ReconcilerConfig
from app.scheduling.spec import TaskSpec, compile_spec
from app.services.placements import PlacementAsk, placement_decide, placement_inputs_read
from tests.factories import NOW, heartbeat_add, pool_add, spec_make, sweep_and_pass, tasks_add

ALL = frozenset(range(SHARD_SLOTS))


async def quota(db: Database, tenant: str, nominal: int) -> None:
    async with db.transaction() as conn:
        await tenant_put(conn, tenant_id=tenant, cohort="c", fair_weight=1.0,
                         quotas={"standard": {"cpuMillis": Quota(nominal, None, None)}}, now=NOW)


async def add(db: Database, tenant: str, count: int, **spec: object) -> list[uuid.UUID]:
    async with db.transaction() as conn:
        return await tasks_add(conn, tenant=tenant, spec=spec_make(**spec), count=count)


async def release_revoking(db: Database, seconds: float) -> None:
    """The runtime gives back every revoking lease."""
    async with db.connection() as conn:
        leases = await conn.fetch("SELECT id, epoch FROM leases WHERE state = 'REVOKING'")
    for lease_id, epoch in leases:
        async with db.transaction() as conn:
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome="released",
                                 message=None, now=NOW + timedelta(seconds=seconds))


async def states(db: Database, *task_ids: uuid.UUID) -> list[tuple[str, str | None]]:
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT id, state, pending_reason ->> 'code' FROM tasks WHERE id = ANY($1::uuid[])",
            list(task_ids))
    by = {r[0]: (r[1], r[2]) for r in rows}
    return [by[t] for t in task_ids]


async def used(db: Database) -> dict[str, int]:
    """Each tenant's cpu usage in the ledger's quota rows."""
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT tenant_id, used FROM quota_usage "
                                "WHERE resource = 'cpuMillis'")
    return {r[0]: int(r[1]) for r in rows}


@contextlib.asynccontextmanager
async def borrowed_world(db: Database, *, capacity: int) -> AsyncIterator[Reconciler]:
    """Pool p0 of ``capacity`` cpu for a (nominal 6000m) and b (2000m, same cohort), and the
    reconciler the test drives (closed on exit)."""
    async with db.transaction() as conn:
        await pool_add(conn, "p0", tenants=["a", "b"], capacity=(capacity, 65536, 0))
    await quota(db, "a", 6000)
    await quota(db, "b", 2000)
    rec = Reconciler(db, ReconcilerConfig(preemption_grace_seconds=600,
                                          reclaim_min_runtime_seconds=0),
                     owner_id="dq", slots=ALL)
    try:
        yield rec
    finally:
        await rec.close()


@pytest.mark.parametrize("together", [False, True], ids=["passes_apart", "one_pass"])
async def test_a_preemptor_and_a_reclaimer_of_one_tenant_stay_within_its_quota(
    db: Database, together: bool,
) -> None:
    async with borrowed_world(db, capacity=10000) as rec:
        borrowed = await add(db, "b", 3, cpu=2000)
        await add(db, "a", 1, cpu=2000)
        await sweep_and_pass(db, rec, 0)
        assert await used(db) == {"a": 2000, "b": 6000}

        (preemptor,) = await add(db, "a", 1, cpu=4000, priority=5,
                                 preemption="lowerPriority")
        if not together:
            await sweep_and_pass(db, rec, 10)
            assert await states(db, preemptor) == [("ADMITTED", "preempting")]
        (second,) = await add(db, "a", 1, cpu=4000)
        await sweep_and_pass(db, rec, 20)
        assert await states(db, preemptor) == [("ADMITTED", "preempting")]
        await release_revoking(db, 21)
        await sweep_and_pass(db, rec, 30)
        await sweep_and_pass(db, rec, 40)

        assert await states(db, preemptor) == [("LEASED", None)]
        assert (await states(db, second))[0][0] == "ADMITTED"
        assert await states(db, *borrowed) == [("LEASED", None)] * 3
        assert await used(db) == {"a": 4000, "b": 6000}


@pytest.mark.parametrize("together", [False, True], ids=["passes_apart", "one_pass"])
async def test_a_preemptors_victim_is_not_counted_beside_its_need(
    db: Database, together: bool,
) -> None:
    async with borrowed_world(db, capacity=8000) as rec:
        borrowed = await add(db, "b", 3, cpu=2000)
        await add(db, "a", 1, cpu=2000)
        await sweep_and_pass(db, rec, 0)
        (preemptor,) = await add(db, "a", 1, cpu=2000, priority=5,
                                 preemption="lowerPriority")
        if not together:
            await sweep_and_pass(db, rec, 10)
        (second,) = await add(db, "a", 1, cpu=4000)
        await sweep_and_pass(db, rec, 20)
        assert await states(db, preemptor, second) == [("ADMITTED", "preempting"),
                                                       ("ADMITTED", "reclaiming")]
        await release_revoking(db, 21)
        await sweep_and_pass(db, rec, 30)

        assert await states(db, preemptor, second) == [("LEASED", None)] * 2
        assert [s for s, _ in await states(db, *borrowed)].count("LEASED") == 1
        assert await used(db) == {"a": 6000, "b": 2000}


async def test_a_preview_counts_the_waiting_preemptor_as_the_pass_does(db: Database) -> None:
    """A placement preview reads the quota rows as a pass plans with them: a's waiting
    preemptor's need is a's usage there, so a's next 4000m task is refused by a's quota,
    not found to fit a's nominal."""
    async with borrowed_world(db, capacity=10000) as rec:
        await add(db, "b", 3, cpu=2000)
        await add(db, "a", 1, cpu=2000)
        await sweep_and_pass(db, rec, 0)
        (preemptor,) = await add(db, "a", 1, cpu=4000, priority=5,
                                 preemption="lowerPriority")
        await sweep_and_pass(db, rec, 10)
        assert await states(db, preemptor) == [("ADMITTED", "preempting")]

        spec = compile_spec(TaskSpec.model_validate(spec_make(cpu=4000)), tenant_id="a")
        async with db.transaction() as conn:  # the preview decides at the clock's now
            await heartbeat_add(conn, "rt-p0", at=datetime.now(UTC))
        async with db.connection() as conn:
            read = await placement_inputs_read(
                conn, PlacementAsk(spec, "binpack", 15.0), cache=SnapshotCache())
        result, _ = placement_decide(read)
        assert result.placement is None and result.reason is not None
        assert result.reason.code.value.startswith("quota_"), result.reason
