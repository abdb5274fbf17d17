"""A reconciler outlives a real restart of its PostgreSQL (an embedded server of its own):
afterwards it LISTENs again, owns its shard slots and the recovery leadership again, with no
operator action."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.db import Database
from app.embedded import EmbeddedPostgres
from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from app.reconciler.ownership import DynamicOwnership
from app.startup import database_migrate
from tests.test_restart_drill import _restart


async def _sessions(db: Database) -> set[str]:
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        )
    return {r[0] for r in rows}


@pytest.mark.slow
async def test_a_reconciler_reconnects_and_owns_again_after_a_restart(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "data")
    url = await asyncio.to_thread(server.start)
    try:
        await database_migrate(url)
        db = Database(url, max_size=4)
        reconciler = Reconciler(db, ReconcilerConfig(tick_seconds=1.0))
        ownership = reconciler.ownership
        assert isinstance(ownership, DynamicOwnership)
        stop = asyncio.Event()
        running = asyncio.create_task(reconciler.run(stop))
        try:
            for _ in range(300):
                if ownership.slots and await ownership.leader():
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the reconciler never owned slots and led")
            before = ownership.slots
            await asyncio.to_thread(_restart, server.pgdata)
            # Every session of the reconciler is back within a few seconds.
            async with asyncio.timeout(20):
                while True:
                    await asyncio.sleep(0.2)
                    try:
                        names = await _sessions(db)
                    except Exception:  # the pool's first try after the restart
                        continue
                    if {"berth-listen", "berth-ownership"} <= names and (
                        ownership.slots == before
                    ):
                        break
            assert await ownership.leader()
            assert not running.done()
        finally:
            stop.set()
            await asyncio.wait_for(running, 30)
            await db.close()
    finally:
        await asyncio.to_thread(server.stop)
