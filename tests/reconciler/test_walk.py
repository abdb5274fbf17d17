"""Lost reservation races: the pass re-reads the pool and walks to the next ranked candidate.

A rival transaction on its own connection lowers a pool's total between the pass's snapshot
and its commit (an operator shrinking capacity concurrently), so the conditional ledger
update loses deterministically.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import SHARD_SLOTS
from app.reconciler import Reconciler, ReconcilerConfig
from app.reconciler.passes import PassContext, pass_run
from tests.factories import (
    NOW,
    heartbeat_add,
    ledger_violations,
    pool_add,
    spec_make,
    task_get,
    tasks_add,
)

ALL = frozenset(range(SHARD_SLOTS))


def _rival_clock(dsn: str, sql: str):
    """Return a clock that runs ``sql`` on another connection the first time it is read."""
    fired = []

    def clock() -> datetime:
        if not fired:
            fired.append(True)

            async def rival() -> None:
                conn = await asyncpg.connect(dsn)
                try:
                    await conn.execute(sql)
                finally:
                    await conn.close()

            worker = threading.Thread(target=lambda: asyncio.run(rival()))
            worker.start()
            worker.join()
        return NOW

    return clock


async def _run(db: AsyncEngine, database_url: str, sql: str, **config: object):
    ctx = PassContext(
        engine=db, config=ReconcilerConfig(**config), claim_owner="walker/1", slots=ALL,
        rng=lambda: 0.0, sleep=asyncio.sleep, clock=_rival_clock(database_url, sql),
    )
    return await pass_run(ctx, pass_id="walker/1", now=NOW)


async def _pools(db: AsyncEngine) -> None:
    async with db.begin() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(2000, 1000, 0))
        await pool_add(conn, "p2", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        await heartbeat_add(conn, "rt-p2", at=NOW)


async def test_lost_race_walks_to_the_next_candidate(db: AsyncEngine, database_url: str) -> None:
    await _pools(db)
    async with db.begin() as conn:
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=500))
    result = await _run(db, database_url, "UPDATE ledgers SET cpu_total = 300 WHERE pool_id = 'p1'")
    assert (result.leased, result.conflicts, result.walked) == (1, 1, 1)
    assert result.commit_rounds == 2
    async with db.connect() as conn:
        task = await task_get(conn, task_id)
        reserved = dict((await conn.execute(
            text("SELECT pool_id, cpu_reserved FROM ledgers"))).all())
    assert task["placement"]["poolId"] == "p2"
    assert task["placement"]["walkedFrom"] == ["p1"]
    assert reserved == {"p1": 0, "p2": 500}
    assert await ledger_violations(db) == []


async def test_past_the_walk_limit_the_task_is_requeued_unparked(
    db: AsyncEngine, database_url: str
) -> None:
    await _pools(db)
    async with db.begin() as conn:
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=500))
    result = await _run(db, database_url,
                        "UPDATE ledgers SET cpu_total = 300 WHERE pool_id = 'p1'",
                        reservation_walk_limit=0)
    assert (result.leased, result.requeued, result.conflicts) == (0, 1, 1)
    async with db.connect() as conn:
        task = await task_get(conn, task_id)
        reason = (await conn.execute(text(
            "SELECT reason FROM task_events WHERE task_id = :t ORDER BY id DESC LIMIT 1"),
            {"t": task_id})).scalar()
    assert (task["state"], task["parked"]) == ("ADMITTED", False)  # retried next pass
    assert reason == "reservation_conflict"
    again = await Reconciler(db, ReconcilerConfig(), owner_id="next", slots=ALL).run_once(now=NOW)
    assert again.leased == 1
    assert await ledger_violations(db) == []


async def test_a_gang_that_loses_a_member_race_reserves_nothing(
    db: AsyncEngine, database_url: str
) -> None:
    await _pools(db)
    async with db.begin() as conn:
        (gang,) = await tasks_add(conn, tenant="t1", spec=spec_make(
            cpu=500, gang={"members": 2, "minPools": 2}))
        (single,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=100))
    result = await _run(db, database_url,
                        "UPDATE ledgers SET cpu_total = 400 WHERE pool_id = 'p2'")
    assert result.requeued == 1
    async with db.connect() as conn:
        assert (await task_get(conn, gang))["state"] == "ADMITTED"
        assert (await task_get(conn, single))["state"] == "LEASED"
        gang_rows = (await conn.execute(text(
            "SELECT count(*) FROM reservations WHERE task_id = :t"), {"t": gang})).scalar()
    assert gang_rows == 0
    assert await ledger_violations(db) == []
