"""Schema metadata SQL: the Alembic revision a database is at, and the migration lock."""

from __future__ import annotations

from app.db import Connection

#: Taken by every migrator so that replicas starting together migrate one at a time.
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(726341001)"


async def schema_revision_read(conn: Connection) -> str | None:
    """Return the database's Alembic revision, or None when it has none (an empty database)."""
    exists = await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
    if not exists:
        return None
    return await conn.fetchval("SELECT version_num FROM alembic_version LIMIT 1")


async def database_ping(conn: Connection) -> None:
    """Run the cheapest statement, to show the database answers."""
    await conn.fetchval("SELECT 1")
