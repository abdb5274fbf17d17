"""The hub's fan-out against the real database: a watcher that falls behind its buffer reads
the log itself and misses nothing; the hub ends its sessions when it loses the database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from app.db import Database
from app.ledger.tasks import task_submit
from app.services.watch import WatchFilter, WatchScope
from app.services.watch_hub import CHANNEL, HubLimits, WatchHub, watch_session

ADMIN = WatchScope("admin", "admin")


async def pool_add(db: Database, pool_id: str) -> None:
    """Create a pool (one pool_events row, in its own transaction)."""
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO pools (id, runtime_class, runtime_instance_id, region) "
            "VALUES ($1, 'gpu-small', 'rt-1', 'eu-west')", pool_id)


async def test_a_watcher_past_its_buffer_reads_the_log_and_misses_nothing(db: Database) -> None:
    hub = WatchHub(db, HubLimits(buffer_batches=1))
    sub = hub.subscribe(ADMIN, key="k")
    try:
        while hub.position is None:
            await hub.advanced(5)
        session = watch_session(hub, sub, start=hub.position, filt=WatchFilter(),
                                idle_seconds=0.2)
        assert (await anext(session)).events == []
        made = [f"pool-{i}" for i in range(5)]
        for pool_id in made:
            await pool_add(db, pool_id)
            await hub.advanced(5)
        assert sub.overflowed
        seen: list[str] = []
        async with asyncio.timeout(10):
            while len(seen) < len(made):
                step = await anext(session)
                seen += [e.pool_id for e in step.events if e.pool_id]
        assert seen == made
        await session.aclose()
    finally:
        hub.unsubscribe(sub)
        await hub.stop()


async def test_each_watcher_gets_only_its_scope_from_the_one_read(db: Database) -> None:
    hub = WatchHub(db)
    operator = hub.subscribe(WatchScope("operator", "op-x"), key="x")
    admin = hub.subscribe(ADMIN, key="a")
    try:
        async with asyncio.timeout(10):
            while hub.position is None:
                await hub.advanced(5)
        async with db.transaction() as conn:
            await conn.execute(
                "INSERT INTO pools (id, runtime_class, runtime_instance_id, region, operators) "
                "VALUES ('pool-x', 'gpu-small', 'rt-1', 'eu', '{op-x}'), "
                "('pool-y', 'gpu-small', 'rt-2', 'eu', '{op-y}')")
        async with asyncio.timeout(10):
            while not admin.buffer:
                await hub.advanced(5)
        assert [e.pool_id for _, events in admin.buffer for e in events] == ["pool-x", "pool-y"]
        assert [e.pool_id for _, events in operator.buffer for e in events] == ["pool-x"]
    finally:
        hub.unsubscribe(operator)
        hub.unsubscribe(admin)
        async with asyncio.timeout(5):
            await hub.stop()
    assert hub.watchers == 0


async def test_an_admission_does_not_notify_the_feed_but_a_change_does(db: Database) -> None:
    """Admissions reach the hubs by the reconcilers' wakeup (so that submissions do not
    commit one at a time on the notification lock); every other change notifies the feed.
    Notifications arrive in commit order, so a marker sent after a write tells whether the
    write notified."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await db.connect()
    try:
        await listener.add_listener(CHANNEL, lambda *args: heard.put_nowait(args[3]))
        async with db.connection() as conn:
            row = await task_submit(
                conn, tenant_id="tenant-a", idempotency_key=None, request_hash=None,
                spec={"runtimeClass": "gpu-small", "requests": {"cpuMillis": 1}},
                now=datetime.now(UTC))
            await conn.execute("SELECT pg_notify($1, 'after the admission')", CHANNEL)
            async with asyncio.timeout(10):
                assert await heard.get() == "after the admission"
            await conn.execute(
                "INSERT INTO task_events (task_id, at, from_state, to_state, reason) "
                "VALUES ($1, now(), 'ADMITTED', 'CANCELLED', 'cancelled')", row.id)
            await conn.execute("SELECT pg_notify($1, 'after the change')", CHANNEL)
            async with asyncio.timeout(10):
                assert [await heard.get(), await heard.get()] == ["", "after the change"]
    finally:
        await listener.close()
