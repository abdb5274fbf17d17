"""The PostgreSQL a benchmark runs on, and the fresh databases it creates there.

A run uses the server of ``--server-url`` (or ``BERTH_DATABASE_URL``) and, without either,
an embedded PostgreSQL started in a temporary directory for the run. Each measured thing
gets its own fresh database on that server, migrated by ``berth migrate`` and dropped after.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import asyncpg

from app.dburl import DatabaseUrl, database_url_parse
from bench.workers import REPO_ROOT, python_env

__all__ = [
    "SERVER_HELP",
    "database_create",
    "database_drop",
    "database_name",
    "bench_connect",
    "describe_url",
    "postgres_server",
    "scratch_database",
]

#: What ``--server-url`` means, for every target's help.
SERVER_HELP = (
    "PostgreSQL server to create the benchmark's fresh databases on (default "
    "BERTH_DATABASE_URL; without it, an embedded PostgreSQL started in a temporary directory "
    "for the run)"
)


def _parsed(url: str) -> DatabaseUrl:
    return database_url_parse(url, source="the server URL (--server-url or BERTH_DATABASE_URL)")


def describe_url(url: str) -> str:
    """Return ``url`` with its password hidden."""
    return _parsed(url).describe()


def _with_database(url: str, name: str) -> str:
    """Return the URL of database ``name`` on the server of ``url``."""
    return _parsed(url).with_database(name).uri()


def database_name(url: str) -> str:
    """Return the name of the database ``url`` points at."""
    return _parsed(url).get("dbname") or ""


async def bench_connect(url: str) -> asyncpg.Connection:
    """Open a connection to ``url`` as every Berth command reads it."""
    return await asyncpg.connect(**_parsed(url).connect_args(application_name="berth-bench",
                                                             timeout=10.0))


@contextmanager
def postgres_server(url: str | None, *, options: Sequence[str] = ()) -> Iterator[tuple[str, str]]:
    """Yield (server URL, description): ``url`` itself, or without it a fresh embedded
    PostgreSQL in a temporary directory, started with ``options`` (``name=value``
    settings), stopped afterwards."""
    if url:
        yield url, describe_url(url)
        return
    from app.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="berth-bench-") as tmp:
        with EmbeddedPostgres(Path(tmp), options=options) as server:
            yield server.url, "embedded PostgreSQL (temporary)"


def schema_migrate(url: str) -> None:
    """Migrate the database ``url`` to the newest schema with ``berth migrate``."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"], cwd=REPO_ROOT,
        env={**python_env(), "BERTH_DATABASE_URL": url}, capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"berth migrate failed: {done.stderr.strip()[-2000:]}")


async def database_create(
    server_url: str, *, prefix: str = "berth_bench", settings: dict[str, str] | None = None,
    migrate: bool = True,
) -> str:
    """Create a fresh database beside ``server_url``, migrate it (unless ``migrate=False``)
    and return its URL.

    ``settings`` are applied with ``ALTER DATABASE … SET`` (e.g. ``log_min_duration_statement``
    to profile the server side of a run).
    """
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    conn = await bench_connect(_with_database(server_url, "postgres"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
        for key, value in (settings or {}).items():
            if not key.replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"not a setting name: {key!r}")
            quoted = value.replace("'", "''")
            await conn.execute(f"ALTER DATABASE \"{name}\" SET {key} = '{quoted}'")
    finally:
        await conn.close()
    url = _with_database(server_url, name)
    if migrate:
        schema_migrate(url)
    return url


async def database_drop(server_url: str, url: str) -> None:
    """Drop the benchmark database ``url`` (closing its connections)."""
    conn = await bench_connect(_with_database(server_url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{database_name(url)}" WITH (FORCE)')
    finally:
        await conn.close()


@asynccontextmanager
async def scratch_database(
    server_url: str, *, prefix: str = "berth_bench", settings: dict[str, str] | None = None,
    migrate: bool = True,
) -> AsyncIterator[str]:
    """Yield the URL of a fresh database (migrated unless ``migrate=False``), dropped after."""
    url = await database_create(server_url, prefix=prefix, settings=settings, migrate=migrate)
    try:
        yield url
    finally:
        await database_drop(server_url, url)


def env_server_url() -> str | None:
    """Return ``BERTH_DATABASE_URL`` if set and not empty."""
    return os.environ.get("BERTH_DATABASE_URL") or None
