"""Multi-host URLs (``h1:p1,h2:p2`` with ``target_session_attrs``), as a highly available
PostgreSQL hands them out, in every command: the first host here is down, the second is the
test database, and every command must find it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from app.db import Database, describe_url
from app.dburl import database_url_parse
from app.errors import ConfigurationError
from app.schema import schema_head
from app.startup import schema_revision
from tests.test_serve import (
    Serve,
    assert_one_line,
    berth_command,
    berth_env,
    berth_run,
    database_empty,
    keys_printed,
    port_free,
)

MULTI = "postgres://berth:s3cr%40t@10.0.0.1:6001,10.0.0.2:6002/berth?target_session_attrs=read-write"


def multi_host(url: str) -> str:
    """Return ``url`` as a two-host URL whose first host has nobody listening."""
    parsed = make_url(url)
    if parsed.host is None:
        pytest.skip("the test PostgreSQL listens on a Unix socket only (set "
                    "BERTH_TEST_DATABASE_URL to a TCP server): a host list names TCP hosts")
    auth = parsed.username or ""
    if parsed.password:
        auth += f":{parsed.password}"
    return (
        f"postgresql://{auth}@127.0.0.1:{port_free()},{parsed.host}:{parsed.port or 5432}/"
        f"{parsed.database}?target_session_attrs=read-write"
    )


def test_a_multi_host_url_is_given_to_asyncpg_as_libpq_reads_it() -> None:
    assert database_url_parse(MULTI).dsn == (
        "postgresql://berth:s3cr%40t@10.0.0.1:6001,10.0.0.2:6002/berth"
        "?target_session_attrs=read-write"
    )


def test_a_multi_host_url_is_described_without_its_password() -> None:
    shown = describe_url(MULTI)
    assert "s3cr" not in shown
    assert "10.0.0.1:6001,10.0.0.2:6002" in shown and "berth:***@" in shown


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        pytest.param("postgres://u:pw@h1:6o01,h2:6002/d", "port '6o01'", id="port-not-a-number"),
        pytest.param("postgres://u:pw@h1:70000,h2:1/d", "port '70000'", id="port-out-of-range"),
        pytest.param("postgres://u:pw@h1:1,,h2:2/d", "host ''", id="empty-host"),
        pytest.param(
            "postgres://u:pw@h1:1,h2:2/d?target_session_attrs=master",
            "target_session_attrs='master'",
            id="unknown-session-attrs",
        ),
        pytest.param("postgres://u:pw@h:abc/d", "port 'abc'", id="single-bad-port"),
    ],
)
def test_an_unusable_url_is_a_configuration_error_without_its_password(
    url: str, needle: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        database_url_parse(url)
    message = str(caught.value)
    assert needle in message and "BERTH_DATABASE_URL" in message
    assert "pw" not in message.replace("password", "")
    assert "pw" not in describe_url(url)


async def test_the_pool_connects_to_the_host_that_answers(database_url: str) -> None:
    db = Database(multi_host(database_url), max_size=1, connect_timeout_seconds=2)
    try:
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT NOT pg_is_in_recovery()")
        dedicated = await db.connect()
        await dedicated.close()
    finally:
        await db.close()


@pytest.mark.slow
def test_migrate_on_a_multi_host_url(server_url: str, tmp_path: Path) -> None:
    with database_empty(server_url) as url:
        result = berth_run("migrate", cwd=tmp_path, BERTH_DATABASE_URL=multi_host(url))
        assert result.returncode == 0, result.stderr
        assert f"revision {schema_head()}" in result.stdout.splitlines()[-1]
        assert "target_session_attrs=read-write" in result.stdout
        assert asyncio.run(schema_revision(url)) == schema_head()


@pytest.mark.slow
def test_keys_on_a_multi_host_url(database_url: str, tmp_path: Path) -> None:
    url = multi_host(database_url)
    created = berth_run(
        "keys", "create", "--role", "operator", "--subject", "multi-host", cwd=tmp_path,
        BERTH_DATABASE_URL=url,
    )
    assert created.returncode == 0, created.stderr
    assert len(keys_printed(created.stdout)) == 1
    listed = berth_run("keys", "list", cwd=tmp_path, BERTH_DATABASE_URL=url)
    assert listed.returncode == 0, listed.stderr
    assert "multi-host" in listed.stdout


@pytest.mark.slow
def test_tenants_on_a_multi_host_url(database_url: str, tmp_path: Path) -> None:
    url = multi_host(database_url)
    made = berth_run(
        "tenants", "set", "multi-host", "--cohort", "research",
        "--quota", "gpu-small:cpuMillis=4000", cwd=tmp_path, BERTH_DATABASE_URL=url,
    )
    assert made.returncode == 0, made.stderr
    got = berth_run("tenants", "get", "multi-host", cwd=tmp_path, BERTH_DATABASE_URL=url)
    assert got.returncode == 0, got.stderr
    assert "research" in got.stdout and "4000" in got.stdout


@pytest.mark.slow
def test_serve_on_a_multi_host_url(database_url: str, tmp_path: Path) -> None:
    serve = Serve(
        tmp_path, tmp_path / "unused", BERTH_DATABASE_URL=multi_host(database_url),
        BERTH_RECONCILER_ENABLED="false",
    )
    try:
        serve.wait_ready()
    finally:
        serve.kill()
    assert "s3cr" not in serve.stdout


async def _reconciler_sessions(url: str) -> int:
    conn = await asyncpg.connect(database_url_parse(url).dsn)
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'berth-reconcile' AND datname = current_database()"
        )
    finally:
        await conn.close()


@pytest.mark.slow
def test_reconcile_on_a_multi_host_url(database_url: str, tmp_path: Path) -> None:
    before = asyncio.run(_reconciler_sessions(database_url))
    proc = subprocess.Popen(
        [*berth_command(), "reconcile"],
        cwd=tmp_path,
        env=berth_env(BERTH_DATABASE_URL=multi_host(database_url)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while asyncio.run(_reconciler_sessions(database_url)) <= before:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the reconciler never connected"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["serve", "--port", "0"], id="serve"),
        pytest.param(["migrate"], id="migrate"),
        pytest.param(["keys", "list"], id="keys-list"),
        pytest.param(["keys", "create", "--role", "admin", "--subject", "x"], id="keys-create"),
        pytest.param(["reconcile"], id="reconcile"),
        pytest.param(["tenants", "list"], id="tenants-list"),
    ],
)
def test_an_unusable_multi_host_url_is_one_line_in_every_command(
    argv: list[str], tmp_path: Path
) -> None:
    url = "postgres://berth:hunter2@127.0.0.1:6001,127.0.0.1:60x2/berth"
    result = berth_run(*argv, cwd=tmp_path, BERTH_DATABASE_URL=url)
    line = assert_one_line(result, "BERTH_DATABASE_URL", "60x2")
    assert "hunter2" not in line


@pytest.mark.slow
def test_no_host_answering_is_one_line_without_the_password(tmp_path: Path) -> None:
    url = f"postgres://berth:hunter2@127.0.0.1:{port_free()},127.0.0.1:{port_free()}/berth"
    result = berth_run("migrate", cwd=tmp_path, BERTH_DATABASE_URL=url)
    line = assert_one_line(result, "unreachable", "BERTH_DATABASE_URL")
    assert "hunter2" not in line
