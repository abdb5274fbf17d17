"""The database goes away mid-request and comes back: every answer is a success or a 503
with ``Retry-After`` (SPEC §6) — never a 500 — and the requests after it recover.

The server under test reaches PostgreSQL through a TCP proxy the test controls, so an outage
is real for it (sockets reset mid-statement, connections refused, connections accepted and
dropped, as during a restart) while other sessions on the shared server are untouched; one
test also kills the server's backends with ``pg_terminate_backend`` while a request waits on
a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import REGISTRY
from sqlalchemy.engine import make_url

from app.auth import KeyCache
from app.db import Database
from app.main import create_app
from tests.api.conftest import BASE_URL, Keys, PoolMaker, assert_problem, settings_for_tests

SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 10}}


class Proxy:
    """A TCP proxy to PostgreSQL that the test can cut: ``refuse`` (nothing listens),
    ``drop`` (connections are accepted and closed at once) or ``up``.

    With ``hold_closes`` set, a connection the server closes stays open towards the client
    (``server_closed`` is set): what the server sent before closing arrives, its end does
    not, as when the two reach a busy client in separate reads.
    """

    def __init__(self, host: str, port: int, socket: str | None = None) -> None:
        #: Upstream: TCP ``host:port``, or the Unix socket file ``socket`` (the embedded
        #: server listens on a socket only).
        self.host, self.port, self.socket = host, port, socket
        self.mode = "up"
        self.listen_port = 0
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.hold_closes = False
        self.server_closed = asyncio.Event()
        self._held: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        """Listen (again, on the same port once it has one)."""
        self._server = await asyncio.start_server(
            self._link, "127.0.0.1", self.listen_port, reuse_address=True
        )
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def cut(self, mode: str) -> None:
        """Reset every open connection, then refuse or drop new ones."""
        self.mode = mode
        for down, up in list(self._links):
            down.transport.abort()
            up.transport.abort()
        for down in self._held:
            down.transport.abort()
        self._held.clear()
        if mode == "refuse" and self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def restore(self) -> None:
        """Let connections through again."""
        self.mode = "up"
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut("refuse")

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode != "up":
            writer.transport.abort()
            return
        try:
            if self.socket is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self.socket)
            else:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        if self.mode != "up":  # cut while this connection was being made
            writer.transport.abort()
            up_writer.transport.abort()
            return
        link = (writer, up_writer)
        self._links.add(link)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            if source is up_reader and self.hold_closes:
                self.server_closed.set()
                self._held.add(sink)
                return  # the client's side stays open until the proxy closes
            sink.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._links.discard(link)


async def proxy_to(database_url: str) -> tuple[Proxy, str]:
    """Start a proxy to the test database, over TCP or to the Unix socket of the embedded
    server; return it and the URL that reaches the database through it."""
    url = make_url(database_url)
    socket_dir = url.query.get("host")
    socket = None
    if isinstance(socket_dir, str) and socket_dir.startswith("/"):
        socket = f"{socket_dir}/.s.PGSQL.{url.port or 5432}"
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432, socket)
    await proxy.start()
    through = (
        url.difference_update_query(["host"])
        .set(host="127.0.0.1", port=proxy.listen_port)
        .render_as_string(False)
    )
    return proxy, through


@contextlib.asynccontextmanager
async def proxied_app(database_url: str, **settings: Any) -> AsyncIterator[tuple[Proxy, FastAPI]]:
    """Yield a proxy to the test database and an app that reaches it only through it."""
    proxy, proxied = await proxy_to(database_url)
    app = create_app(settings_for_tests(proxied, db_connect_timeout_seconds=1, **settings))
    try:
        async with app.router.lifespan_context(app):
            yield proxy, app
    finally:
        await proxy.close()


def client_of(app: FastAPI, *, raise_app_exceptions: bool = False) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=30)


def assert_unavailable(response: httpx.Response) -> None:
    """Assert ``response`` is the 503 of an unreachable database, with Retry-After."""
    problem = assert_problem(response, 503)
    assert int(response.headers["retry-after"]) >= 1, response.headers
    assert problem["type"] == "https://berth.dev/problems/unavailable", problem


Answer = tuple[float, float, str, httpx.Response]


async def _requests(
    client: httpx.AsyncClient, keys: Keys, task_id: str, stop: asyncio.Event, n: int,
    out: _Answers,
) -> None:
    """Send a mix of reads and writes until ``stop``; append (start, end, what, answer) to
    ``out`` as each is answered."""
    loop = asyncio.get_running_loop()
    calls = itertools.cycle([
        ("POST", "/v1/tasks", keys.tenant_a, SPEC),
        ("GET", f"/v1/tasks/{task_id}", keys.tenant_a, None),
        ("GET", "/v1/pools", keys.admin, None),
        ("POST", "/v1/runtimes/rt-1/heartbeat", keys.runtime_1, None),
        ("PUT", "/v1/pools/pool-o/capacity", keys.admin,
         {"cpuMillis": 100_000 + n, "memoryMiB": 8192, "llmSlots": 4}),
        ("GET", "/v1/tasks", keys.tenant_a, None),
    ])
    for method, path, headers, body in itertools.islice(calls, n % 6, None):
        if stop.is_set():
            break
        started = loop.time()
        answer = await client.request(method, path, json=body, headers=headers)
        out.append((started, loop.time(), f"{method} {path}", answer))
        await asyncio.sleep(0.005)


class _Answers(list[Answer]):
    """The answers so far, in the order they came; :meth:`until` waits for enough."""

    def __init__(self) -> None:
        super().__init__()
        self.grew = asyncio.Event()

    def append(self, answer: Answer) -> None:
        super().append(answer)
        self.grew.set()

    async def until(self, what: Callable[[], bool], seconds: float = 30.0) -> None:
        """Wait until ``what()`` holds, and at least 0.5 s."""
        await asyncio.sleep(0.5)
        async with asyncio.timeout(seconds):
            while not what():
                self.grew.clear()
                await self.grew.wait()


@pytest.mark.parametrize("mode", ["refuse", "drop"])
async def test_an_outage_under_load_answers_503_with_retry_after_never_500(
    database_url: str, keys: Keys, pool_make: PoolMaker, client: httpx.AsyncClient, mode: str
) -> None:
    await pool_make("pool-o")
    task = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()
    counted_before = REGISTRY.get_sample_value("berth_http_database_unavailable_total") or 0.0
    async with proxied_app(database_url, db_pool_size=8) as (proxy, app):
        # No key cache: every request also looks its key up, so the outage hits that path too.
        app.state.key_cache = KeyCache(ttl_seconds=0)
        loop = asyncio.get_running_loop()
        async with client_of(app) as http:
            stop = asyncio.Event()
            answers = _Answers()
            workers = [asyncio.create_task(_requests(http, keys, task["id"], stop, n, answers))
                       for n in range(12)]
            # Enough answered before the cut and after the restore, however slow the machine.
            await answers.until(lambda: sum(1 for a in answers if a[3].status_code < 300) > 20)
            cut_at = loop.time()
            await proxy.cut(mode)
            await asyncio.sleep(1.2)
            await proxy.restore()
            restored_at = loop.time()
            await answers.until(lambda: sum(1 for a in answers if a[0] > restored_at) > 20)
            stop.set()
            await asyncio.gather(*workers)

    statuses = Counter(a.status_code for _, _, _, a in answers)
    wrong = [(what, a.status_code, a.text[:300]) for _, _, what, a in answers
             if a.status_code not in (200, 201, 503)]
    assert not wrong, (statuses, wrong[:5])
    for _, _, _, answer in answers:
        if answer.status_code == 503:
            assert_unavailable(answer)
    # Each of them is counted (the dashboard's database 503s).
    counted = REGISTRY.get_sample_value("berth_http_database_unavailable_total") or 0.0
    assert counted - counted_before == statuses[503]
    # Whatever was sent and answered while the database was away is a 503 (a request sent
    # late in the outage may rightly succeed once its connection attempt meets the restore).
    during = [(what, a.status_code) for start, end, what, a in answers
              if cut_at < start and end < restored_at]
    assert during and all(s == 503 for _, s in during), (statuses, during)
    assert sum(1 for _, end, _, a in answers if end < cut_at and a.status_code < 300) > 20
    # Recovery at once: every request sent after the restore succeeds (the pool replaced
    # the connections the outage broke; none is handed out dead).
    after = [(what, a.status_code) for start, _, what, a in answers if start > restored_at]
    assert len(after) > 20 and all(s < 300 for _, s in after), after


async def test_the_key_lookup_answers_503_while_the_database_is_away(
    database_url: str, keys: Keys
) -> None:
    """And the app answers it: nothing escapes to the server (which would log a traceback
    per request through the whole outage)."""
    async with (
        proxied_app(database_url) as (proxy, app),
        client_of(app, raise_app_exceptions=True) as http,
    ):
        await proxy.cut("refuse")
        for method, path, key in (("GET", "/v1/pools", "admin"), ("POST", "/v1/tasks", "tenant_a"),
                                  ("GET", f"/v1/tasks/{uuid.uuid4()}", "tenant_a")):
            body = SPEC if method == "POST" else None
            answer = await http.request(method, path, json=body, headers=keys[key])
            assert_unavailable(answer)
        await proxy.restore()
        answer = await http.get("/v1/pools", headers=keys.admin)
        assert answer.status_code == 200, answer.text


async def test_a_backend_killed_mid_request_answers_503_and_the_next_request_works(
    database_url: str, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    """A write waits on a row lock the test holds; the test terminates the server's backends
    (the ones of its application_name, on this test database only)."""
    await pool_make("pool-k")
    app = create_app(settings_for_tests(database_url))
    async with app.router.lifespan_context(app), client_of(app) as http:
        app.state.db.application_name = "berth-outage-test"
        await http.get("/v1/pools", headers=keys.admin)  # keys cached, pool warm
        holder = await asyncpg.connect(make_url(database_url).render_as_string(False))
        try:
            lock = holder.transaction()
            await lock.start()
            await holder.execute("SELECT 1 FROM pools WHERE id = 'pool-k' FOR UPDATE")
            capacity = {"cpuMillis": 9000, "memoryMiB": 9000, "llmSlots": 9}
            request = asyncio.create_task(
                http.put("/v1/pools/pool-k/capacity", json=capacity, headers=keys.admin)
            )
            waiting: list[int] = []
            for _ in range(100):
                waiting = [r["pid"] for r in await holder.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'berth-outage-test' AND wait_event_type = 'Lock'")]
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting, "the request never reached the lock"
            await holder.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'berth-outage-test'")
            answer = await asyncio.wait_for(request, 10)
            assert_unavailable(answer)
            await lock.rollback()
        finally:
            await holder.close()
        again = await http.put("/v1/pools/pool-k/capacity", json=capacity, headers=keys.admin)
        assert again.status_code == 200, again.text
        assert again.json()["capacity"] == capacity
