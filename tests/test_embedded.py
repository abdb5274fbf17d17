"""The embedded PostgreSQL: start/stop, reuse, guests, and adoption after a SIGKILLed owner."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import Database
from app.embedded import EmbeddedPostgres, postgres_processes

REPO = Path(__file__).resolve().parent.parent


async def _server_user(url: str) -> str:
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            return await conn.fetchval("SELECT current_user")
    finally:
        await db.close()


def _user(url: str) -> str:
    return asyncio.run(_server_user(url))


def _postmaster_pid(server: EmbeddedPostgres) -> int:
    return int((server.pgdata / "postmaster.pid").read_text().split()[0])


def test_start_is_idempotent_and_stop_leaves_no_process(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "data")
    url = server.start()
    try:
        assert server.start() == url
        assert server.owned
        assert _user(url) == "postgres"
        assert "host=" in url and str(server.pgdata) in url  # a Unix socket in the data dir
        assert postgres_processes(server.pgdata)
    finally:
        server.stop()
    assert postgres_processes(server.pgdata) == []
    assert not (server.pgdata / "postmaster.pid").exists()

    # A second start on the same directory reuses the initialised data.
    (server.data_dir / "marker").write_text("x")
    with EmbeddedPostgres(tmp_path / "data") as again:
        assert _user(again.url) == "postgres"
    assert postgres_processes(server.pgdata) == []


def test_data_dir_too_long_for_a_socket_path_still_works(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    server = EmbeddedPostgres(deep)
    server.start()
    try:
        assert str(server.pgdata) not in server.url
        assert _user(server.url) == "postgres"
    finally:
        server.stop()
    assert postgres_processes(server.pgdata) == []


def test_guest_never_stops_the_owners_server(tmp_path: Path) -> None:
    owner = EmbeddedPostgres(tmp_path)
    owner.start()
    try:
        guest = EmbeddedPostgres(tmp_path)
        guest.start()
        assert not guest.owned
        assert _postmaster_pid(guest) == _postmaster_pid(owner)
        guest.stop()
        assert postgres_processes(owner.pgdata)
        assert _user(owner.url) == "postgres"
    finally:
        owner.stop()
    assert postgres_processes(owner.pgdata) == []


@pytest.mark.slow
def test_server_of_a_sigkilled_owner_is_adopted_then_stopped(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from app.embedded import EmbeddedPostgres\n"
        "server = EmbeddedPostgres(sys.argv[1])\n"
        "print(server.start(), flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert owner.stdout is not None
        url = owner.stdout.readline().strip()
        assert url.startswith("postgresql://"), url
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    orphan = EmbeddedPostgres(tmp_path)
    assert postgres_processes(orphan.pgdata), "the SIGKILLed owner's server should still run"
    pid_before = _postmaster_pid(orphan)

    orphan.start()
    try:
        assert orphan.owned
        assert _postmaster_pid(orphan) == pid_before
        assert orphan.url == url
        assert _user(orphan.url) == "postgres"
    finally:
        orphan.stop()
    assert postgres_processes(orphan.pgdata) == []
