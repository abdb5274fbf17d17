"""Claims: row locks taken with SKIP LOCKED across connections, released with the
transaction, owned slots, policy-aware claim order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from app.config import SHARD_SLOTS
from app.db import Connection, Database
from app.ledger.claims import Unclaim, tasks_claim, tasks_unclaim, tasks_unpark
from app.shards import shard_of
from tests.factories import NOW, spec_make, task_get, tasks_add

ALL = frozenset(range(SHARD_SLOTS))


@asynccontextmanager
async def _rolled_back(db: Database) -> AsyncIterator[Connection]:
    """Yield a connection inside a transaction that is rolled back at the end."""
    async with db.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            yield conn
        finally:
            await tx.rollback()


async def _claim(conn, owner: str = "o", *, batch: int = 10, slots=ALL, at=NOW, **kw):
    del owner  # a claim has no owner column: it is the row lock of the caller's transaction
    return await tasks_claim(conn, slots=slots, batch=batch, now=at, **kw)


async def test_fifo_claims_in_admission_order_and_writes_nothing(db: Database) -> None:
    async with db.transaction() as conn:
        a = await tasks_add(conn, tenant="t1", count=3)
        b = await tasks_add(conn, tenant="t2", count=2)
    async with db.transaction() as conn:
        before = await task_get(conn, a[0])
        claimed = await _claim(conn, batch=4)
        events = await conn.fetchval("SELECT count(*) FROM task_events")
        # Seen from another connection the claimed rows are locked, and still ADMITTED.
        async with db.connection() as other:
            free = await other.fetch(
                "SELECT id FROM tasks ORDER BY seq FOR UPDATE SKIP LOCKED")
            assert (await task_get(other, a[0]))["state"] == "ADMITTED"
    assert [c.id for c in claimed] == a + b[:1]
    assert [r[0] for r in free] == b[1:]
    assert events == 0  # a claim writes no event
    async with db.connection() as conn:
        assert await task_get(conn, a[0]) == before


async def test_claims_end_with_the_transaction(db: Database) -> None:
    async with db.transaction() as conn:
        ids = await tasks_add(conn, tenant="t1", count=3)
    async with _rolled_back(db) as conn:
        assert [c.id for c in await _claim(conn, batch=2)] == ids[:2]
    # The pass rolled back (or died): its tasks are claimable again at once, unchanged.
    async with db.transaction() as conn:
        assert [c.id for c in await _claim(conn, batch=3)] == ids


async def test_concurrent_claims_skip_each_others_rows(db: Database) -> None:
    async with db.transaction() as conn:
        ids = await tasks_add(conn, tenant="t1", count=6)
    async with db.transaction() as one, db.transaction() as two:
        first = await _claim(one, "one", batch=4)
        second = await _claim(two, "two", batch=4)  # one's rows are locked, not committed
    assert [c.id for c in first] == ids[:4]
    assert [c.id for c in second] == ids[4:]


async def test_only_owned_slots_are_claimed(db: Database) -> None:
    async with db.transaction() as conn:
        await tasks_add(conn, tenant="t1", count=2)
        other = await tasks_add(conn, tenant="t2", count=2)
    async with db.transaction() as conn:
        claimed = await _claim(conn, slots=frozenset({shard_of("t2")}))
    assert shard_of("t1") != shard_of("t2")
    assert [c.id for c in claimed] == other


async def test_a_transaction_does_not_claim_its_own_rows_twice(db: Database) -> None:
    async with db.transaction() as conn:
        ids = await tasks_add(conn, tenant="t1", count=3, spec=spec_make(priority=0))
        (high,) = await tasks_add(conn, tenant="t1", spec=spec_make(priority=9))
    async with _rolled_back(db) as conn:
        # SKIP LOCKED does not skip the transaction's own locks: the fifo fill after the
        # priority claim must leave out what it took.
        claimed = await _claim(conn, batch=4, policy="priority")
    assert sorted(c.id for c in claimed) == sorted([*ids, high])
    assert len(claimed) == 4


async def test_fair_claim_caps_each_tenant_so_a_backlog_cannot_fill_the_batch(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        big = await tasks_add(conn, tenant="big", count=500)
        small = await tasks_add(conn, tenant="small", count=1)
    async with _rolled_back(db) as conn:
        fifo = await _claim(conn, "f", batch=16)
    assert small[0] not in {c.id for c in fifo}
    async with db.transaction() as conn:
        fair = await _claim(conn, "fair", batch=16, policy="fair")
    ids = [c.id for c in fair]
    assert small[0] in ids
    assert len(ids) == 16  # the rest of the batch is still filled from the backlog
    assert ids.count(small[0]) == 1 and set(ids) - {small[0]} <= set(big)


async def test_priority_claim_takes_high_priority_and_aged_tasks(db: Database) -> None:
    old_at = NOW - timedelta(hours=2)
    async with db.transaction() as conn:
        (old_low,) = await tasks_add(conn, tenant="t1", spec=spec_make(priority=0),
                                     admitted_at=old_at)
        lows = await tasks_add(conn, tenant="t1", count=5, spec=spec_make(priority=0))
        highs = await tasks_add(conn, tenant="t1", count=2, spec=spec_make(priority=50))
    async with db.transaction() as conn:
        claimed = await _claim(conn, "p", batch=3, policy="priority", aging_seconds=60)
    # 2 hours of aging at one point a minute beats priority 50.
    assert [c.id for c in claimed] == [old_low, *highs]
    assert not {c.id for c in claimed} & set(lows)


async def test_unclaim_parks_with_reason_and_unpark_releases(db: Database) -> None:
    async with db.transaction() as conn:
        (task_id,) = await tasks_add(conn, tenant="t1")
    reason = {"code": "insufficient_cpu", "message": "no room", "rejections": {}}
    async with db.transaction() as conn:
        await _claim(conn, "o")
        done = await tasks_unclaim(conn, now=NOW, items=[
            Unclaim(task_id, "insufficient_cpu", reason, parked=True)])
    assert done == {task_id}
    async with db.transaction() as conn:
        assert await _claim(conn, "o2") == []  # parked: not claimable
        assert await tasks_unpark(conn, slots=frozenset({shard_of("t1")}), now=NOW) == 1
        assert [c.id for c in await _claim(conn, "o3")] == [task_id]
    async with db.connection() as conn:
        row = await task_get(conn, task_id)
    assert row["pending_reason"] == reason  # kept while it is retried


async def test_fair_tenant_listing_rotates_over_every_slot(db: Database) -> None:
    tenants = [f"tenant-{i}" for i in range(8)]
    async with db.transaction() as conn:
        for t in tenants:
            await tasks_add(conn, tenant=t, count=2)
    seen: set[str] = set()
    for rotation in range(SHARD_SLOTS):
        async with _rolled_back(db) as conn:
            claimed = await _claim(conn, f"r{rotation}", batch=8, policy="fair",
                                   fair_rotation=rotation)
        assert len({c.tenant_id for c in claimed}) == 8  # one per tenant, whatever the start
        seen |= {c.tenant_id for c in claimed}
    assert seen == set(tenants)
