"""`berth serve` under attack by clients without a key, over real sockets and processes.

300 connections send the head of ``POST /v1/task-batches`` with ``Content-Length: 100`` and
one byte of body, each reopened as soon as the server answers or closes it (from a separate
process); meanwhile an authenticated client reads ``GET /v1/tasks``. Before the front door,
each slow body held an in-flight slot for the whole body deadline, and the reads were 503.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.test_serve import Serve
from tests.test_serve_timeouts import key_create

pytestmark = pytest.mark.slow

SLOW_CONNECTIONS = 300
ATTACK_SECONDS = 16
READ_SECONDS = 12


#: The head of a task batch that announces 100 bytes of body, and the one byte that follows.
SLOW_BODY = (b"POST /v1/task-batches HTTP/1.1\r\nHost: berth\r\n"
             b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")


def slow_bodies(port: int, connections: int, seconds: float) -> tuple[int, dict[int, int]]:
    """Hold ``connections`` connections sending :data:`SLOW_BODY`, each reopened as soon as
    the server answers or closes it; return how many were opened and the answers."""
    opened = 0
    statuses: dict[int, int] = {}

    async def holder(deadline: float) -> None:
        nonlocal opened
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            opened += 1
            try:
                writer.write(SLOW_BODY)
                head = await asyncio.wait_for(reader.read(12),
                                              max(0.01, deadline - time.monotonic()))
                if head.startswith(b"HTTP/1.1 "):
                    statuses[int(head[9:12])] = statuses.get(int(head[9:12]), 0) + 1
            except (TimeoutError, ConnectionError):
                pass
            finally:
                writer.close()

    async def run() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(holder(deadline) for _ in range(connections)))

    asyncio.run(run())
    return opened, statuses


def reads(port: int, key: str, seconds: float) -> dict[int, int]:
    """Read ``GET /v1/tasks`` with ``key``, one request after another, for ``seconds``."""
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        while time.monotonic() < deadline:
            status = client.get("/v1/tasks", params={"limit": 10}).status_code
            statuses[status] = statuses.get(status, 0) + 1
    return statuses


@pytest.fixture
def serve(tmp_path: Path, database_url: str) -> Iterator[Serve]:
    """Yield a `berth serve` on the test database, with its default limits."""
    server = Serve(tmp_path, tmp_path / "unused-data-dir", BERTH_DATABASE_URL=database_url,
                   BERTH_RECONCILER_ENABLED="false")
    try:
        server.wait_ready()
        yield server
        assert server.stop(signal.SIGTERM) == 0, server.err.read_text()
    finally:
        server.kill()


def test_slow_bodies_without_a_key_leave_an_authenticated_clients_reads_answered(
    serve: Serve, database_url: str
) -> None:
    key = key_create(database_url)
    with ProcessPoolExecutor(max_workers=1) as attacker:
        attack = attacker.submit(slow_bodies, serve.port, SLOW_CONNECTIONS, ATTACK_SECONDS)
        time.sleep(2)  # the connections are open and churning
        statuses = reads(serve.port, key, READ_SECONDS)
        opened, answers = attack.result()

    count = sum(statuses.values())
    assert count >= 5, statuses  # one client, one read after another, on a shared machine
    assert statuses.get(200, 0) / count >= 0.9, statuses
    # The attack really ran: many more connections than it holds at once, each answered 401
    # from its headers (its body never read), none given a slot.
    assert opened > SLOW_CONNECTIONS, opened
    assert set(answers) == {401}, answers
