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
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench.workers import REPO_ROOT, python_env

__all__ = [
    "SERVER_HELP",
    "database_create",
    "database_drop",
    "database_name",
    "describe_url",
    "plain_url",
    "postgres_server",
    "scratch_database",
]

#: What ``--server-url`` means, for every target's help.
SERVER_HELP = (
    "PostgreSQL server to create the benchmark's fresh databases on (default "
    "BERTH_DATABASE_URL; without it, an embedded PostgreSQL started in a temporary directory "
    "for the run)"
)


def plain_url(url: str) -> str:
    """Return ``url`` as a plain ``postgresql://`` DSN that asyncpg accepts."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme.startswith(("postgresql", "postgres")):
        raise SystemExit(f"berth bench: not a PostgreSQL URL: {describe_url(url)}")
    return "postgresql://" + rest


def describe_url(url: str) -> str:
    """Return ``url`` with its password hidden."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _with_database(url: str, name: str) -> str:
    """Return the DSN of database ``name`` on the server of ``url``."""
    return urlunsplit(urlsplit(plain_url(url))._replace(path="/" + name))


def database_name(url: str) -> str:
    """Return the name of the database ``url`` points at."""
    return urlsplit(plain_url(url)).path.lstrip("/")


@contextmanager
def postgres_server(url: str | None) -> Iterator[tuple[str, str]]:
    """Yield (server URL, description): ``url`` itself, or without it a fresh embedded
    PostgreSQL in a temporary directory, stopped afterwards."""
    if url:
        yield url, describe_url(url)
        return
    from app.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="berth-bench-") as tmp:
        with EmbeddedPostgres(Path(tmp)) as server:
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
    conn = await asyncpg.connect(_with_database(server_url, "postgres"))
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
    conn = await asyncpg.connect(_with_database(server_url, "postgres"))
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
