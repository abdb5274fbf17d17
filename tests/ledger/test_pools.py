"""Pool ledger functions racing reservations and leases on real separate connections."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.db import Connection, Database
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

NOW = datetime(2030, 1, 1, tzinfo=UTC)
FIELDS = {"runtime_class": "gpu", "runtime_instance_id": "rt-1", "region": "eu"}


async def pool_with_capacity(db: Database, pool_id: str, cpu: int) -> None:
    """Create ``pool_id`` with ``cpu`` millicores (and plenty of the rest)."""
    async with db.transaction() as conn:
        await pool_create(conn, pool_id=pool_id, fields=FIELDS, now=NOW)
        await pool_capacity_put(conn, pool_id=pool_id, totals=(cpu, 10_000, 10), now=NOW)


async def backend_pid(conn: Connection) -> int:
    """Return the server process id of ``conn``."""
    return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def blocked_on_a_lock(db: Database, pid: int, waiter: asyncio.Task) -> None:
    """Return once backend ``pid`` waits on a lock (or ``waiter`` already ended)."""
    async with db.connection() as probe:
        while not waiter.done():
            waiting = await probe.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
            )
            if waiting:
                return
            await asyncio.sleep(0.01)


async def test_lowering_capacity_makes_a_waiting_reservation_lose(db: Database) -> None:
    await pool_with_capacity(db, "pool-x", cpu=1000)
    async with db.connection() as admin, db.connection() as reconciler:
        admin_tx = admin.transaction()
        await admin_tx.start()
        await pool_capacity_put(admin, pool_id="pool-x", totals=(500, 10_000, 10), now=NOW)
        reconciler_tx = reconciler.transaction()
        await reconciler_tx.start()
        pid = await backend_pid(reconciler)
        reserve = asyncio.create_task(
            ledger_reserve_many(reconciler, amounts={"pool-x": (800, 0, 0)}, now=NOW)
        )
        await blocked_on_a_lock(db, pid, reserve)
        await admin_tx.commit()
        reserved = await reserve
        await reconciler_tx.commit()

    assert reserved == set(), "800 no longer fits in 500: the reservation must lose"
    async with db.connection() as conn:
        pool = await pool_get(conn, pool_id="pool-x")
    assert pool is not None and pool.capacity == (500, 10_000, 10)
    assert pool.reserved == (0, 0, 0)


async def test_lowering_capacity_waits_for_a_reservation_and_then_refuses(
    db: Database,
) -> None:
    await pool_with_capacity(db, "pool-x", cpu=1000)
    async with db.connection() as reconciler, db.connection() as admin:
        reconciler_tx = reconciler.transaction()
        await reconciler_tx.start()
        assert await ledger_reserve_many(
            reconciler, amounts={"pool-x": (800, 0, 0)}, now=NOW
        ) == {"pool-x"}
        admin_tx = admin.transaction()
        await admin_tx.start()
        pid = await backend_pid(admin)
        lower = asyncio.create_task(
            pool_capacity_put(admin, pool_id="pool-x", totals=(500, 10_000, 10), now=NOW)
        )
        await blocked_on_a_lock(db, pid, lower)
        await reconciler_tx.commit()
        with pytest.raises(CapacityBelowReserved, match="cpuMillis total 500 is below the 800"):
            await lower
        await admin_tx.rollback()


async def test_delete_waits_for_a_lease_being_granted_and_then_refuses(db: Database) -> None:
    await pool_with_capacity(db, "pool-x", cpu=1000)
    task_id = uuid.uuid4()
    async with db.connection() as reconciler, db.connection() as admin:
        reconciler_tx = reconciler.transaction()
        await reconciler_tx.start()
        await reconciler.execute(
            "INSERT INTO tasks (id, tenant_id, shard, state, runtime_class, spec) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            task_id, "t", 0, "LEASED", "gpu", {},
        )
        await reconciler.execute(
            "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, expires_at) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            uuid.uuid4(), task_id, "pool-x", "rt-1", 1, NOW + timedelta(minutes=1),
        )
        # A pass reserves on the pool's ledger row in the transaction that writes the lease
        # (no foreign key locks the pool row): the delete waits on that row.
        await reconciler.execute(
            "INSERT INTO reservations (task_id, pool_id, cpu, memory, llm) "
            "VALUES ($1, 'pool-x', 100, 0, 0)", task_id)
        await reconciler.execute(
            "UPDATE ledgers SET cpu_reserved = cpu_reserved + 100 WHERE pool_id = 'pool-x'")
        admin_tx = admin.transaction()
        await admin_tx.start()
        pid = await backend_pid(admin)
        deleting = asyncio.create_task(pool_delete(admin, pool_id="pool-x"))
        await blocked_on_a_lock(db, pid, deleting)
        await reconciler_tx.commit()
        with pytest.raises(PoolHasLiveLeases):
            await deleting
        await admin_tx.rollback()


async def test_pools_list_pages_by_id_for_each_viewer(db: Database) -> None:
    async with db.transaction() as conn:
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

    async with db.connection() as conn:
        first, after = await pools_list(conn, viewer=tenant_a, limit=1)
        rest, end = await pools_list(conn, viewer=tenant_a, limit=5, after=after)
        operated, _ = await pools_list(conn, viewer=operator, limit=5)
        none, _ = await pools_list(conn, viewer=nobody, limit=5)

    assert [p.id for p in first] == ["p0"] and after == "p0"
    assert [p.id for p in rest] == ["p2"] and end is None
    assert [p.id for p in operated] == ["p3"]
    assert none == []
