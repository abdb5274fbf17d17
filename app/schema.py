"""Schema management: Alembic upgrade to head, and whether a database is at head."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config() -> Config:
    """Return an Alembic config that needs no ini file."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def schema_head() -> str:
    """Return the revision id of the newest migration."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def schema_current(conn: AsyncConnection) -> str | None:
    """Return the database's current Alembic revision, or None on an empty database."""

    def _current(sync_conn) -> str | None:  # type: ignore[no-untyped-def]
        return MigrationContext.configure(sync_conn).get_current_revision()

    return await conn.run_sync(_current)


async def schema_upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the database behind ``engine`` to ``revision`` (default: head)."""
    await _run(engine, "upgrade", revision)


async def schema_downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    """Downgrade the database behind ``engine`` to ``revision`` (default: base)."""
    await _run(engine, "downgrade", revision)


async def _run(engine: AsyncEngine, direction: str, revision: str) -> None:
    from alembic import command

    config = alembic_config()

    def _apply(sync_conn) -> None:  # type: ignore[no-untyped-def]
        config.attributes["connection"] = sync_conn
        getattr(command, direction)(config, revision)

    async with engine.begin() as conn:
        # One migrator at a time, even when several replicas start together.
        await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(726341001)")
        await conn.run_sync(_apply)
