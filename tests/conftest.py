"""Test database: one fresh, migrated PostgreSQL database per test session.

Where it comes from, in order:

1. ``BERTH_TEST_DATABASE_URL`` (a server URL): the fixture creates its own database there
   and drops it at the end;
2. else the embedded PostgreSQL (``app.embedded``) in a temporary directory;
3. else, with ``BERTH_TEST_BACKEND=docker``, a throwaway testcontainers PostgreSQL.

Each test that asks for ``db`` gets a clean state (every table truncated).

The suite runs in parallel (pytest-xdist, ``-n 2 --dist loadgroup`` in pyproject.toml): each
worker is a session of its own, with its own database. Tests are handed out one by one, except
those :func:`pytest_collection_modifyitems` keeps together on one worker, one after another.
``-n 0`` runs in one process (needed for ``-s`` to show what a test prints).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from app.db import Database
from app.ledger.tables import metadata
from app.schema import schema_upgrade

#: Directories whose tests run one after another on one worker: the drills (each brings up
#: PostgreSQL servers and measures how fast Berth recovers; two at once would each slow the
#: other down) and the browser tests (one Chromium per worker; the README's screenshots).
SERIAL_DIRECTORIES = {"drill": "drill", "console": "console"}
#: Single tests that are drills too (they run with the drill directory's).
SERIAL_FILES = {"test_restart_drill.py": "drill"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group tests for ``--dist loadgroup``: a test in ``SERIAL_DIRECTORIES`` or
    ``SERIAL_FILES`` gets its group, and a test that uses a module- or class-scoped fixture
    stays with the rest of its file (the fixture is then set up once). An explicit
    ``@pytest.mark.xdist_group`` wins."""
    tests = Path(__file__).resolve().parent
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = Path(item.path).resolve()
        parts = path.relative_to(tests).parts if path.is_relative_to(tests) else ()
        group = SERIAL_FILES.get(path.name) or (
            SERIAL_DIRECTORIES.get(parts[0]) if len(parts) > 1 else None
        )
        if group is None and _shares_a_fixture(item):
            group = "/".join(parts) or path.name
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in ("module", "class", "package")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


def _server_url() -> Iterator[str]:
    url = os.environ.get("BERTH_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if os.environ.get("BERTH_TEST_BACKEND") == "docker":
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield pg.get_connection_url()
        return
    import tempfile

    from app.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="berth-test-pg-") as tmp:
        server = EmbeddedPostgres(tmp)
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """Yield the URL of a PostgreSQL server the tests may create databases on."""
    yield from _server_url()


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """Yield the URL of a fresh database on the test server, migrated to head."""
    name = f"berth_test_{uuid.uuid4().hex[:12]}"
    maintenance = make_url(server_url).set(database="postgres").render_as_string(False)
    url = make_url(server_url).set(database=name).render_as_string(False)
    asyncio.run(_admin(maintenance, f'CREATE DATABASE "{name}"'))

    asyncio.run(schema_upgrade(url))
    try:
        yield url
    finally:
        asyncio.run(_admin(maintenance, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest_asyncio.fixture(scope="session")
async def database(database_url: str) -> AsyncIterator[Database]:
    """Yield the :class:`Database` (asyncpg pool) of the session's test database; at the
    session's end, replay every pass its tests recorded (:func:`session_replay_check`)."""
    database = Database(database_url, max_size=40)
    try:
        yield database
        await session_replay_check(database)
    finally:
        await database.close()


async def session_replay_check(database: Database) -> None:
    """Replay every pass the session recorded (each test's clean state keeps them, and each
    xdist worker has a database of its own) and fail unless every decision is identical:
    the planner is a deterministic function of the recorded inputs."""
    from datetime import UTC, datetime

    from app.services.replays import ReplayWindow, replay_run

    answer = await replay_run(database, window=ReplayWindow(), profile=None,
                              now=datetime.now(UTC))
    summary = answer["summary"]
    assert answer["identical"] == answer["decisions"] and not summary["defects"] and \
        not summary["skipped"], (
        f"{answer['decisions'] - answer['identical']} of the session's {answer['decisions']} "
        f"recorded decisions differ on replay: {answer['changed'][:5]}, "
        f"defects {summary['defects'][:5]}, skipped {summary['skipped'][:5]}")


#: Tables a test's clean state keeps: the recorded passes, replayed at the session's end.
KEPT = frozenset({"pass_records", "pass_record_pools"})
TRUNCATE = "TRUNCATE {} RESTART IDENTITY CASCADE".format(
    ", ".join(t.name for t in metadata.sorted_tables if t.name not in KEPT)
)


async def database_clean(database: Database) -> None:
    """Empty every table of the test database.

    A background session of the test before (a watch hub's read, a reconciler's pass that
    is being cancelled) may hold a share lock on one table while it waits for another that
    the truncation has taken: PostgreSQL then breaks the deadlock by failing the truncation,
    which is tried again once that session has gone."""
    for attempt in range(5):
        try:
            async with database.connection() as conn:
                await conn.execute(TRUNCATE)
            return
        except asyncpg.exceptions.DeadlockDetectedError:
            if attempt == 4:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))


@pytest_asyncio.fixture
async def db(database: Database) -> AsyncIterator[Database]:
    """Yield the database on a clean state (every table truncated before the test)."""
    await database_clean(database)
    yield database
