"""A synchronous standby named and none connected: commits wait, and the API sheds.

The database here is a PostgreSQL of the test's own (the embedded one, in a temporary
directory) with ``synchronous_standby_names`` naming a standby that never connects, as a
primary whose standby is gone: every COMMIT waits for it. The API must answer no 2xx for a
write the standby does not have, hold at most its pool's connections in that wait (a
tenant's concurrent submissions share a statement, so one connection can hold several), and
answer everything else 503 with Retry-After within its bounds instead of piling requests
up; once a standby is no longer required the waiting writes complete.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.config import Settings
from app.db import Database
from app.dburl import database_url_parse
from app.embedded import EmbeddedPostgres
from app.ledger.keys import api_key_create
from app.main import create_app
from app.startup import database_migrate
from tests.api.conftest import BASE_URL, pool_body

pytestmark = pytest.mark.slow

TASK = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 10}}
POOL_SIZE = 2
IN_FLIGHT = 6
SUBMISSIONS = 12
#: How long the standby's absence may take to show (a busy machine is slow to get there).
SETTLE_SECONDS = 30


@pytest_asyncio.fixture
async def server_url(tmp_path: Path) -> AsyncIterator[str]:
    server = EmbeddedPostgres(tmp_path / "pg")
    url = await asyncio.to_thread(server.start)
    try:
        await database_migrate(url)
        yield url
    finally:
        await asyncio.to_thread(server.stop)


async def _synchronous(url: str, names: str | None) -> None:
    conn = await asyncpg.connect(database_url_parse(url).dsn)
    try:
        if names is None:
            await conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        else:
            await conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def _waiting_for_the_standby(url: str) -> int:
    """Return how many connections wait for the standby to confirm a commit."""
    conn = await asyncpg.connect(database_url_parse(url).dsn)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"))
    finally:
        await conn.close()


async def test_commits_wait_for_the_standby_and_the_api_sheds(server_url: str) -> None:
    db = Database(server_url, max_size=1)
    async with db.transaction() as conn:
        admin = await api_key_create(conn, role="admin", subject="admin", tenant_ids=(),
                                     runtime_instance_ids=())
        tenant = await api_key_create(conn, role="tenant", subject="t", tenant_ids=("tenant-a",),
                                      runtime_instance_ids=())
    await db.close()
    settings = Settings(
        database_url=server_url, reconciler_enabled=False, db_pool_size=POOL_SIZE,
        db_connect_timeout_seconds=1, max_in_flight_requests=IN_FLIGHT,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL,
                                     timeout=60) as client:
            created = await client.post("/v1/pools", json=pool_body("pool-a"),
                                        headers={"Authorization": f"Bearer {admin}"})
            assert created.status_code == 201, created.text
            headers = {"Authorization": f"Bearer {tenant}"}
            # The tenant's key is checked (and its use recorded) before the standby goes.
            listed = await client.get("/v1/tasks", headers=headers)
            assert listed.status_code == 200, listed.text
            await _synchronous(server_url, "standby_that_never_connects")
            try:
                submissions = [asyncio.ensure_future(client.post("/v1/tasks", json=TASK,
                                                                 headers=headers))
                               for _ in range(SUBMISSIONS)]
                await asyncio.sleep(3)  # three times the bound on waiting for a connection
                # On a busy machine the statement may reach its commit, and the refusals
                # their bound, later: wait for both, within a deadline.
                deadline = time.monotonic() + SETTLE_SECONDS
                while True:
                    waiting = [s for s in submissions if not s.done()]
                    done = [s for s in submissions if s.done()]
                    standby_waits = await _waiting_for_the_standby(server_url)
                    if (0 < len(waiting) <= IN_FLIGHT and 0 < standby_waits) or (
                            time.monotonic() > deadline):
                        break
                    await asyncio.sleep(0.2)
                # Only the writes in a statement holding a connection wait (a tenant's
                # concurrent submissions share one), within the in-flight slots; every other
                # one was refused.
                assert 0 < len(waiting) <= IN_FLIGHT, [s.result().status_code for s in done]
                assert 0 < standby_waits <= POOL_SIZE
                for answered in done:
                    response = answered.result()
                    assert response.status_code == 503, response.text
                    assert response.headers["retry-after"] == "1"
            finally:
                # Whatever failed above, release the waiting commits: the app cannot stop
                # while its connections wait for a standby.
                released = time.monotonic()
                await _synchronous(server_url, None)
            for finished in await asyncio.gather(*waiting):
                assert finished.status_code == 201, finished.text
            assert time.monotonic() - released < 30
