"""Single statements on the API's hot paths, on raw asyncpg or on a SQLAlchemy connection.

Task submission and task reads are one SQL statement each. Through SQLAlchemy each costs a
pool checkout (with its pre-ping), a transaction and the execution machinery: about four
times the CPU of the statement itself. So the API runs them on a :class:`StatementPool` —
raw asyncpg connections in autocommit, where one statement is one atomic round trip — while
the same ledger functions still accept a SQLAlchemy ``AsyncConnection`` (inside the caller's
transaction) for everything else and for tests. The SQL is written once, with ``$n``
placeholders, which both drivers understand.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

#: A connection the hot-path ledger functions accept.
Statements = AsyncConnection | asyncpg.Connection

__all__ = ["StatementPool", "Statements", "statement_fetch"]


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release: single autocommit statements leave no state."""


class StatementPool:
    """A small asyncpg pool, opened lazily, for autocommit single statements of the API."""

    def __init__(self, dsn: str, *, max_size: int, connect_timeout_seconds: float = 5.0) -> None:
        self._dsn = dsn
        self._max_size = max_size
        self._timeout = connect_timeout_seconds
        self._pool: asyncpg.Pool | None = None
        # Two first requests at once must not both create a pool (one would leak).
        self._opening = asyncio.Lock()

    @classmethod
    def for_engine(
        cls, engine: AsyncEngine, *, max_size: int, connect_timeout_seconds: float = 5.0
    ) -> StatementPool:
        """Return a pool on the database of ``engine``."""
        dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        return cls(dsn, max_size=max_size, connect_timeout_seconds=connect_timeout_seconds)

    async def open(self) -> None:
        """Create the pool (connections are made on first use)."""
        async with self._opening:
            if self._pool is not None:
                return
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=0,
                max_size=self._max_size,
                reset=_no_reset,
                timeout=self._timeout,
                server_settings={"application_name": "berth-api"},
            )

    async def close(self) -> None:
        """Close every connection of the pool."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    def connection(self) -> AbstractAsyncContextManager[asyncpg.Connection]:
        """Return a context giving a connection in autocommit mode (one statement, one commit)."""
        if self._pool is not None:
            # The pool's own acquire context: no generator wrapper on the hot path.
            return self._pool.acquire()  # type: ignore[return-value]
        return self._opening_connection()

    @asynccontextmanager
    async def _opening_connection(self) -> AsyncIterator[asyncpg.Connection]:
        await self.open()
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            yield conn


async def statement_fetch(conn: Statements, sql: str, args: Sequence[Any]) -> list[Any]:
    """Run ``sql`` (``$n`` placeholders) with ``args`` and return its rows (index access)."""
    if isinstance(conn, AsyncConnection):
        return list((await conn.exec_driver_sql(sql, tuple(args))).all())
    return await conn.fetch(sql, *args)
