"""Schema management: Alembic upgrade to head, and whether a database is at head.

Alembic runs on SQLAlchemy (its only use at run time besides the table metadata); everything
else reaches the database through :class:`app.db.Database`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING

from app.db import Connection
from app.dburl import database_url_parse
from app.ledger.meta import MIGRATION_LOCK, schema_revision_read

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config() -> Config:
    """Return an Alembic config that needs no ini file."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def _revisions() -> dict[str, object]:
    """Return ``down_revision`` by ``revision`` of the migration files, read as text: Alembic's
    script directory imports every migration, with Alembic and SQLAlchemy (some 30 MiB of a
    reconciler process, which only checks the head)."""
    out: dict[str, object] = {}
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        names: dict[str, object] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        try:
                            names[t.id] = ast.literal_eval(node.value)
                        except (ValueError, TypeError, SyntaxError):
                            names[t.id] = node  # not a literal: Alembic decides
        if "revision" in names:
            if names.get("branch_labels") is not None or names.get("depends_on") is not None:
                return {}
            out[str(names["revision"])] = names.get("down_revision")
    return out


def schema_head() -> str:
    """Return the revision id of the newest migration."""
    revisions = _revisions()
    downs = list(revisions.values())
    # One straight line of revisions (no merge, branch or dependency): its one head.
    if revisions and all(d is None or (isinstance(d, str) and d in revisions) for d in downs):
        heads = set(revisions) - set(downs)
        if len(heads) == 1:
            return heads.pop()
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def schema_current(conn: Connection) -> str | None:
    """Return the database's current Alembic revision, or None on an empty database."""
    return await schema_revision_read(conn)


def schema_engine(url: str, *, connect_timeout_seconds: float = 5.0) -> AsyncEngine:
    """Return a SQLAlchemy engine (for Alembic) whose connections asyncpg opens from ``url``
    with the same arguments as every other connection of Berth's; it keeps no pool."""
    import asyncpg
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    args = database_url_parse(url).connect_args(
        application_name="berth-migrate", timeout=connect_timeout_seconds
    )

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(**args)

    return create_async_engine("postgresql+asyncpg://", async_creator=connect, poolclass=NullPool)


async def schema_upgrade(
    url: str, revision: str = "head", *, connect_timeout_seconds: float = 5.0
) -> None:
    """Upgrade the database at ``url`` to ``revision`` (default: head)."""
    await _run(url, "upgrade", revision, connect_timeout_seconds)


async def schema_downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision`` (default: base)."""
    await _run(url, "downgrade", revision, 5.0)


async def _run(url: str, direction: str, revision: str, connect_timeout_seconds: float) -> None:
    from alembic import command
    from sqlalchemy import text

    config = alembic_config()

    def _apply(sync_conn) -> None:  # type: ignore[no-untyped-def]
        config.attributes["connection"] = sync_conn
        getattr(command, direction)(config, revision)

    engine = schema_engine(url, connect_timeout_seconds=connect_timeout_seconds)
    try:
        async with engine.begin() as conn:
            # One migrator at a time, even when several replicas start together.
            await conn.execute(text(MIGRATION_LOCK))
            await conn.run_sync(_apply)
    finally:
        await engine.dispose()
