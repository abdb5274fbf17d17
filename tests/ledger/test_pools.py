"""Pool ledger functions racing reservations and leases on real separate connections."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.ledger.pools import (
    CapacityBelowReserved,
    PoolHasLiveLeases,
    PoolViewer,
    pool_capacity_put,
    pool_create,
    pool_delete,
    pool_get,
    pools_list,
)
from app.ledger.reservations import ledger_reserve_many
from app.ledger.tables import leases, tasks

NOW = datetime(2030, 1, 1, tzinfo=UTC)
FIELDS = {"runtime_class": "gpu", "runtime_instance_id": "rt-1", "region": "eu"}


async def pool_with_capacity(db: AsyncEngine, pool_id: str, cpu: int) -> None:
    """Create ``pool_id`` with ``cpu`` millicores (and plenty of the rest)."""
    async with db.begin() as conn:
        await pool_create(conn, pool_id=pool_id, fields=FIELDS, now=NOW)
        await pool_capacity_put(conn, pool_id=pool_id, totals=(cpu, 10_000, 10), now=NOW)


async def backend_pid(conn: AsyncConnection) -> int:
    """Return the server process id of ``conn``."""
    return int(await conn.scalar(text("SELECT pg_backend_pid()")))


async def blocked_on_a_lock(db: AsyncEngine, pid: int, waiter: asyncio.Task) -> None:
    """Return once backend ``pid`` waits on a lock (or ``waiter`` already ended)."""
    async with db.connect() as probe:
        while not waiter.done():
            waiting = await probe.scalar(
                text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            )
            if waiting:
                return
            await asyncio.sleep(0.01)


async def test_lowering_capacity_makes_a_waiting_reservation_lose(db: AsyncEngine) -> None:
    await pool_with_capacity(db, "pool-x", cpu=1000)
    async with db.connect() as admin, db.connect() as reconciler:
        await admin.begin()
        await pool_capacity_put(admin, pool_id="pool-x", totals=(500, 10_000, 10), now=NOW)
        await reconciler.begin()
        pid = await backend_pid(reconciler)
        reserve = asyncio.create_task(
            ledger_reserve_many(reconciler, amounts={"pool-x": (800, 0, 0)}, now=NOW)
        )
        await blocked_on_a_lock(db, pid, reserve)
        await admin.commit()
        reserved = await reserve
        await reconciler.commit()

    assert reserved == set(), "800 no longer fits in 500: the reservation must lose"
    async with db.connect() as conn:
        pool = await pool_get(conn, pool_id="pool-x")
    assert pool is not None and pool.capacity == (500, 10_000, 10)
    assert pool.reserved == (0, 0, 0)


async def test_lowering_capacity_waits_for_a_reservation_and_then_refuses(
    db: AsyncEngine,
) -> None:
    await pool_with_capacity(db, "pool-x", cpu=1000)
    async with db.connect() as reconciler, db.connect() as admin:
        await reconciler.begin()
        assert await ledger_reserve_many(
            reconciler, amounts={"pool-x": (800, 0, 0)}, now=NOW
        ) == {"pool-x"}
        await admin.begin()
        pid = await backend_pid(admin)
        lower = asyncio.create_task(
            pool_capacity_put(admin, pool_id="pool-x", totals=(500, 10_000, 10), now=NOW)
        )
        await blocked_on_a_lock(db, pid, lower)
        await reconciler.commit()
        with pytest.raises(CapacityBelowReserved, match="cpuMillis total 500 is below the 800"):
            await lower
        await admin.rollback()


async def test_delete_waits_for_a_lease_being_granted_and_then_refuses(db: AsyncEngine) -> None:
    await pool_with_capacity(db, "pool-x", cpu=1000)
    task_id = uuid.uuid4()
    async with db.connect() as reconciler, db.connect() as admin:
        await reconciler.begin()
        await reconciler.execute(
            insert(tasks).values(
                id=task_id, tenant_id="t", shard=0, state="LEASED", runtime_class="gpu", spec={}
            )
        )
        await reconciler.execute(
            insert(leases).values(
                id=uuid.uuid4(),
                task_id=task_id,
                pool_id="pool-x",
                runtime_instance_id="rt-1",
                epoch=1,
                expires_at=NOW + timedelta(minutes=1),
            )
        )
        await admin.begin()
        pid = await backend_pid(admin)
        deleting = asyncio.create_task(pool_delete(admin, pool_id="pool-x"))
        await blocked_on_a_lock(db, pid, deleting)
        await reconciler.commit()
        with pytest.raises(PoolHasLiveLeases):
            await deleting
        await admin.rollback()


async def test_pools_list_pages_by_id_for_each_viewer(db: AsyncEngine) -> None:
    async with db.begin() as conn:
        for i, tenants in enumerate((["a"], ["b"], ["a", "b"], [])):
            await pool_create(
                conn,
                pool_id=f"p{i}",
                fields={**FIELDS, "tenant_ids": tenants, "operators": ["ops"] if i == 3 else []},
                now=NOW,
            )
    tenant_a = PoolViewer(role="tenant", subject="a", tenant_ids=frozenset({"a"}))
    operator = PoolViewer(role="operator", subject="ops")
    nobody = PoolViewer(role="tenant", subject="x")

    async with db.connect() as conn:
        first, after = await pools_list(conn, viewer=tenant_a, limit=1)
        rest, end = await pools_list(conn, viewer=tenant_a, limit=5, after=after)
        operated, _ = await pools_list(conn, viewer=operator, limit=5)
        none, _ = await pools_list(conn, viewer=nobody, limit=5)

    assert [p.id for p in first] == ["p0"] and after == "p0"
    assert [p.id for p in rest] == ["p2"] and end is None
    assert [p.id for p in operated] == ["p3"]
    assert none == []
