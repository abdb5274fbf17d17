"""A connection PostgreSQL ends while it sits idle in the pool is never handed out as if it
worked: the request that meets it answers 503 with ``Retry-After`` (never 500, nothing
escapes to the HTTP server, which would close the client's connection), the connection is
discarded, and the next request gets a new one.

A server that restarts or terminates a backend sends an error (57P01) and then closes the
socket. A client that reads the error while idle, and the close only later, holds a
connection that looks open but can no longer run anything (asyncpg: "cannot switch to
state 12; another operation (2) is in progress"). The proxy of these tests holds the close,
so that moment lasts as long as the test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from app.api.problems import database_unavailable
from app.db import Database
from app.main import create_app
from app.reconciler.retry import transient_kind
from app.services.wakeups import submitted
from tests.api.conftest import Keys, PoolMaker, settings_for_tests
from tests.api.test_database_outage import (
    SPEC,
    Proxy,
    assert_unavailable,
    client_of,
    proxy_to,
)


@contextlib.asynccontextmanager
async def proxied(database_url: str) -> AsyncIterator[tuple[Proxy, FastAPI]]:
    """Yield a close-holding proxy and an app with one pooled connection, through it."""
    proxy, through = await proxy_to(database_url)
    app = create_app(settings_for_tests(through, db_pool_size=1))
    try:
        async with app.router.lifespan_context(app):
            try:
                yield proxy, app
            finally:
                await proxy.cut("refuse")  # the held closes reach the pool before it closes
    finally:
        await proxy.close()


async def _backend_terminate(database_url: str, db: Database, proxy: Proxy) -> None:
    """End the backend of ``db``'s one pooled connection, as a restart does, and wait until
    the client has read the server's error (the proxy holds the close that follows it)."""
    async with db.connection() as conn:
        pid = conn.get_server_pid()
    proxy.hold_closes = True
    admin = await asyncpg.connect(make_url(database_url).render_as_string(False))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    await asyncio.wait_for(proxy.server_closed.wait(), 10)
    await asyncio.sleep(0.1)  # the client reads the error; the close never reaches it


async def test_a_connection_ended_while_idle_answers_503_then_is_replaced(
    database_url: str, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-f")
    async with proxied(database_url) as (proxy, app), client_of(
        app, raise_app_exceptions=True
    ) as http:
        warm = await http.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)
        assert warm.status_code == 201, warm.text
        await _backend_terminate(database_url, app.state.db, proxy)

        first = await http.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)
        assert_unavailable(first)
        # The dead connection was discarded, not put back: the next request works (the
        # proxy still holds the old socket's close, so reusing it would fail again).
        again = await http.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)
        assert again.status_code == 201, again.text


@pytest.mark.parametrize("how", ["transaction", "connection"])
async def test_the_database_discards_a_connection_that_cannot_run_a_statement(
    database_url: str, how: str
) -> None:
    """Both ways in (the wakeup sender and every read use ``connection()``): the error is a
    database fault, and the connection is gone from the pool."""
    async with proxied(database_url) as (proxy, app):
        db: Database = app.state.db
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT 1") == 1
        await _backend_terminate(database_url, db, proxy)

        use = db.transaction() if how == "transaction" else db.connection()
        with pytest.raises(Exception) as failed:
            async with use as conn:
                await conn.execute("SELECT pg_notify('berth_test', 'x')")
        assert database_unavailable(failed.value), repr(failed.value)
        assert transient_kind(failed.value) == "connection"  # a reconciler retries it
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT 2") == 2


async def test_the_wakeup_sender_survives_a_dead_connection_and_sends_the_next(
    database_url: str,
) -> None:
    async with proxied(database_url) as (proxy, app):
        db: Database = app.state.db
        listener = await asyncpg.connect(make_url(database_url).render_as_string(False))
        heard: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("berth_wakeup", lambda *a: heard.put_nowait(a[3]))
        try:
            async with db.connection() as conn:
                await conn.fetchval("SELECT 1")
            await _backend_terminate(database_url, db, proxy)
            submitted(db)  # meets the dead connection: lost, logged, the tick covers it
            await asyncio.sleep(0.2)
            while not heard.empty():
                heard.get_nowait()
            submitted(db)
            payload = await asyncio.wait_for(heard.get(), 10)
            assert "submitted" in payload
        finally:
            await listener.close()
