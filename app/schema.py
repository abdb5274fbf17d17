"""Schema management: Alembic upgrade to head, and whether a database is at head.

Alembic runs on SQLAlchemy (its only use at run time besides the table metadata); everything
else reaches the database through :class:`app.db.Database`.
"""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import Connection, async_url
from app.ledger.meta import MIGRATION_LOCK, schema_revision_read

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


async def schema_current(conn: Connection) -> str | None:
    """Return the database's current Alembic revision, or None on an empty database."""
    return await schema_revision_read(conn)


async def schema_upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (default: head)."""
    await _run(url, "upgrade", revision)


async def schema_downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision`` (default: base)."""
    await _run(url, "downgrade", revision)


async def _run(url: str, direction: str, revision: str) -> None:
    from alembic import command
    from sqlalchemy import text

    config = alembic_config()

    def _apply(sync_conn) -> None:  # type: ignore[no-untyped-def]
        config.attributes["connection"] = sync_conn
        getattr(command, direction)(config, revision)

    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            # One migrator at a time, even when several replicas start together.
            await conn.execute(text(MIGRATION_LOCK))
            await conn.run_sync(_apply)
    finally:
        await engine.dispose()
