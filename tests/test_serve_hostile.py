"""`berth serve` under attack by clients without a key, over real sockets and processes.

300 connections send the head of ``POST /v1/task-batches`` with ``Content-Length: 100`` and
one byte of body, each reopened as soon as the server answers or closes it (from a separate
process); meanwhile an authenticated client reads ``GET /v1/tasks``. Before the front door,
each slow body held an in-flight slot for the whole body deadline, and the reads were 503.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from bench.hostile import reads_measure, slow_bodies
from tests.test_serve import Serve
from tests.test_serve_timeouts import key_create

pytestmark = pytest.mark.slow

SLOW_CONNECTIONS = 300
ATTACK_SECONDS = 16
READ_SECONDS = 12


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
        latencies, statuses = reads_measure(serve.port, key, READ_SECONDS)
        tally = attack.result()

    reads = sum(statuses.values())
    assert reads >= 5, statuses  # one client, one read after another, on a shared machine
    assert statuses.get(200, 0) / reads >= 0.9, statuses
    assert len(latencies) == statuses.get(200, 0)
    # The attack really ran: many more connections than it holds at once, each answered 401
    # from its headers (its body never read), none given a slot.
    assert tally.opened > SLOW_CONNECTIONS, tally
    assert set(tally.statuses) == {401}, tally
