"""A database pool whose every connection is busy sheds: the first caller waits at most
``BERTH_DB_POOL_WAIT_SECONDS`` (not the connect timeout), the callers after it are refused at
once until a connection is free again, and the API answers them 503 with ``Retry-After``.

The connections are held busy by real sessions of the pool; the connect timeout is set far
above every bound the tests wait, so a caller left to it would fail the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from app.db import Database, PoolBusy
from app.main import create_app
from tests.api.conftest import Keys, settings_for_tests
from tests.api.test_database_outage import assert_unavailable, client_of

#: Far above anything a test waits: a caller that waits for it fails the test.
CONNECT_TIMEOUT = 120.0


@contextlib.asynccontextmanager
async def busy(db: Database, n: int) -> AsyncIterator[None]:
    """Hold ``n`` connections of ``db`` (each in a session of its own) until the block ends."""
    held = asyncio.Event()
    release = asyncio.Event()
    holding = 0

    async def hold() -> None:
        nonlocal holding
        async with db.connection() as conn:
            await conn.fetchval("SELECT 1")
            holding += 1
            if holding == n:
                held.set()
            await release.wait()

    holders = [asyncio.create_task(hold()) for _ in range(n)]
    await asyncio.wait_for(held.wait(), 30)
    try:
        yield
    finally:
        release.set()
        await asyncio.gather(*holders)


async def test_a_busy_pool_refuses_after_the_wait_then_at_once_until_one_is_free(
    database_url: str,
) -> None:
    db = Database(database_url, max_size=2, connect_timeout_seconds=CONNECT_TIMEOUT,
                  pool_wait_seconds=0.2)
    try:
        async with busy(db, 2):
            with pytest.raises(PoolBusy):
                async with asyncio.timeout(30):
                    async with db.connection():
                        pass
            # The pool is known busy now: the next callers are not made to wait at all,
            # however long the bound (it is raised here to make that visible).
            db.pool_wait_seconds = CONNECT_TIMEOUT
            for use in (db.connection, db.transaction):
                with pytest.raises(PoolBusy):
                    async with asyncio.timeout(30):
                        async with use():
                            pass
        # Connections are free again: taken at once, and the pool waits normally again.
        async with db.transaction() as conn:
            assert await conn.fetchval("SELECT 1") == 1
        async with busy(db, 1), db.connection() as conn:
            assert await conn.fetchval("SELECT 2") == 2
    finally:
        await db.close()


async def test_a_caller_that_gets_a_connection_within_the_wait_is_served(
    database_url: str,
) -> None:
    """Waiting is still allowed: a connection that comes back within the bound is taken."""
    db = Database(database_url, max_size=1, connect_timeout_seconds=CONNECT_TIMEOUT,
                  pool_wait_seconds=CONNECT_TIMEOUT)
    try:
        async with db.connection() as first:
            waiter = asyncio.create_task(_select(db))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            await first.fetchval("SELECT 1")
        assert await asyncio.wait_for(waiter, 30) == 3
    finally:
        await db.close()


async def _select(db: Database) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval("SELECT 3"))


async def test_the_api_sheds_with_503_while_every_connection_is_busy(
    database_url: str, keys: Keys
) -> None:
    settings = settings_for_tests(
        database_url, db_pool_size=2, db_connect_timeout_seconds=CONNECT_TIMEOUT,
        db_pool_wait_seconds=0.2,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app), client_of(
        app, raise_app_exceptions=True
    ) as http:
        ok = await http.get("/v1/pools", headers=keys.admin)  # the key is cached from here
        assert ok.status_code == 200, ok.text
        async with busy(app.state.db, 2):
            async with asyncio.timeout(30):
                answers = await asyncio.gather(*(
                    http.get("/v1/pools", headers=keys.admin) for _ in range(20)
                ))
            for answer in answers:
                assert_unavailable(answer)
        again = await http.get("/v1/pools", headers=keys.admin)
        assert again.status_code == 200, again.text


def _summarized(caplog: pytest.LogCaptureFixture, message: str) -> tuple[int, int, bool]:
    """Return (lines, occurrences they count, whether any carries a traceback)."""
    lines = [r for r in caplog.records if r.getMessage().startswith(message)]
    return (len(lines), sum(getattr(r, "count", 0) for r in lines),
            any(r.exc_info for r in lines))


async def test_overload_is_logged_as_a_summary_not_a_line_per_request(
    database_url: str, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Submissions refused by a busy pool, and the reconciler wakeups that find it busy,
    are logged as at most two lines each (the first, then a count), without tracebacks."""
    from app.api.problems import _UNAVAILABLE_LOG
    from app.services.wakeups import _FAILED_LOG, submitted

    settings = settings_for_tests(
        database_url, db_pool_size=2, db_connect_timeout_seconds=CONNECT_TIMEOUT,
        db_pool_wait_seconds=0.2,
    )
    app = create_app(settings)
    spec = {"runtimeClass": "python-3.11", "requests": {"cpuMillis": 10, "memoryMiB": 1}}
    async with app.router.lifespan_context(app), client_of(app) as http:
        ok = await http.post("/v1/tasks", headers=keys.tenant_a, json=spec)
        assert ok.status_code == 201, ok.text
        for summary in (_UNAVAILABLE_LOG, _FAILED_LOG):
            summary.flush()  # what earlier tests left counted is not this test's
        caplog.clear()
        async with busy(app.state.db, 2):
            async with asyncio.timeout(30):
                answers = await asyncio.gather(*(
                    http.post("/v1/tasks", headers=keys.tenant_a, json=spec)
                    for _ in range(50)))
                for _ in range(50):
                    submitted(app.state.db)
                    await asyncio.sleep(0.01)  # each wakeup tried (and refused) in turn
        for answer in answers:
            assert_unavailable(answer)
        for summary in (_UNAVAILABLE_LOG, _FAILED_LOG):
            summary.flush()
    lines, counted, traceback = _summarized(caplog, "database unavailable")
    assert lines <= 2 and counted == 50 and not traceback
    lines, counted, traceback = _summarized(
        caplog, "could not wake reconcilers after a submission")
    assert lines <= 2 and counted >= 2 and not traceback
