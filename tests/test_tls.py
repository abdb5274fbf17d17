"""TLS to PostgreSQL, verified: Berth's connections (the API's, its reconciler's, a migration's)
use TLS with ``sslmode=verify-full`` and ``sslrootcert`` as ``pg_stat_ssl`` shows, and a
server whose certificate the URL's CA did not sign, or that is named otherwise than the
certificate says, is refused with one line saying so."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest

from app.ledger.meta import MIGRATION_LOCK
from tests.test_serve import Serve, assert_one_line, berth_command, berth_env, berth_run
from tests.tls import TlsPostgres, tls_required, tls_server_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, tls_required]

#: Berth's sessions on the server with their TLS state, by application name.
_SESSIONS = """
    SELECT a.application_name, s.ssl, s.version
      FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
     WHERE a.datname = 'berth' AND a.application_name LIKE 'berth-%'
"""


def _verified(server: TlsPostgres) -> str:
    return server.url(host="localhost", query=f"sslmode=verify-full&sslrootcert={server.ca}")


def _sessions(server: TlsPostgres) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for line in server.psql(_SESSIONS, database="berth").splitlines():
        name, ssl, version = line.split("|")
        found.setdefault(name, set()).add(f"{ssl}:{version}")
    return found


def test_serve_and_its_reconciler_connect_with_tls_verified(
    tls_server: TlsPostgres, tmp_path: Path
) -> None:
    serve = Serve(tmp_path, tmp_path / "unused", BERTH_DATABASE_URL=_verified(tls_server))
    try:
        serve.wait_ready()
        deadline = time.monotonic() + 60
        while not {"berth-api", "berth-listen", "berth-ownership"} <= set(_sessions(tls_server)):
            assert time.monotonic() < deadline, _sessions(tls_server)
            time.sleep(0.2)
        sessions = _sessions(tls_server)
    finally:
        serve.kill()
    assert all(states <= {"t:TLSv1.3", "t:TLSv1.2"} for states in sessions.values()), sessions


async def _migrate_seen_waiting(server: TlsPostgres, workdir: Path) -> tuple[str, int]:
    """Run ``berth migrate`` while holding its lock; return its session's TLS state as
    pg_stat_ssl shows it while it waits, and its exit status once the lock is free."""
    holder = await asyncpg.connect(host=str(server.root), port=server.port, user="postgres",
                                   database="berth")
    try:
        await holder.execute(MIGRATION_LOCK.replace("xact_lock", "lock"))
        proc = await asyncio.create_subprocess_exec(
            *berth_command(), "migrate", cwd=workdir, stdin=subprocess.DEVNULL,
            env=berth_env(BERTH_DATABASE_URL=_verified(server)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        state = None
        while state is None:
            assert proc.returncode is None and time.monotonic() < deadline, "migrate never waited"
            state = await holder.fetchval(
                "SELECT s.ssl::text || ':' || s.version FROM pg_stat_activity a "
                "JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'berth-migrate' "
                "AND a.wait_event_type = 'Lock'")
            await asyncio.sleep(0.1)
        await holder.execute(MIGRATION_LOCK.replace("xact_lock", "unlock"))
        return state, await asyncio.wait_for(proc.wait(), 120)
    finally:
        await holder.close()


async def test_migrate_connects_with_tls_verified(
    tls_server: TlsPostgres, tmp_path: Path
) -> None:
    state, status = await _migrate_seen_waiting(tls_server, tmp_path)
    assert state in ("true:TLSv1.3", "true:TLSv1.2")
    assert status == 0


@pytest.mark.parametrize("command", [["migrate"], ["keys", "list"]])
def test_a_certificate_the_ca_did_not_sign_is_refused_in_one_line(
    command: list[str], tls_server: TlsPostgres, tmp_path: Path
) -> None:
    url = tls_server.url(host="localhost",
                         query=f"sslmode=verify-full&sslrootcert={tls_server.wrong_ca}")
    result = berth_run(*command, cwd=tmp_path, BERTH_DATABASE_URL=url)
    assert_one_line(result, "unreachable", "TLS certificate was refused", "self-signed",
                    "sslrootcert")


def test_a_server_named_otherwise_than_its_certificate_is_refused(
    tls_server: TlsPostgres, tmp_path: Path
) -> None:
    url = tls_server.url(host="127.0.0.1",
                         query=f"sslmode=verify-full&sslrootcert={tls_server.ca}")
    result = berth_run("migrate", cwd=tmp_path, BERTH_DATABASE_URL=url)
    assert_one_line(result, "TLS certificate was refused", "not valid for '127.0.0.1'")


def test_verify_ca_accepts_the_same_server_by_address(
    tls_server: TlsPostgres, tmp_path: Path
) -> None:
    url = tls_server.url(host="127.0.0.1", query=f"sslmode=verify-ca&sslrootcert={tls_server.ca}")
    result = berth_run("keys", "list", cwd=tmp_path, BERTH_DATABASE_URL=url)
    assert result.returncode == 0, result.stderr
