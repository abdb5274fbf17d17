"""Alembic environment: runs migrations on an async (asyncpg) connection.

The connection comes from ``config.attributes["connection"]`` when Berth runs the
migrations itself, else from ``sqlalchemy.url`` or ``BERTH_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from app.ledger.tables import metadata
from app.schema import schema_engine

config = context.config
target_metadata = metadata


def _do_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("BERTH_DATABASE_URL")
    if not url:
        raise SystemExit("set BERTH_DATABASE_URL to the database to migrate")
    engine = schema_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_do_run)
            await conn.commit()
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on a new one."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _do_run(connection)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
