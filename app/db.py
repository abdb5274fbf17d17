"""The one runtime path to PostgreSQL: an asyncpg pool with explicit transactions.

Every statement Berth runs while serving goes through :class:`Database` (SQLAlchemy remains
only for Alembic migrations and the table metadata they are checked against; see
docs/decisions/0002-one-database-path.md for the measurement behind the choice).

Two ways in, and no third:

- ``async with db.transaction() as conn:`` — a connection inside ``BEGIN … COMMIT``. The
  commit runs when the block exits, so a caller that returns after the block has a durable,
  visible result; a failure at commit raises out of the block (and the caller answers an
  error, never a 2xx). Every write uses this.
- ``async with db.connection() as conn:`` — a connection in autocommit, for reads and for a
  write that is one statement (one statement is one atomic round trip).

JSON and JSONB columns are encoded and decoded with orjson on every connection: pass Python
values (or ``bytes`` already holding JSON) and read Python values back.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeAlias

import asyncpg
import orjson

from app.dburl import DatabaseUrl, database_url_parse
from app.errors import ConfigurationError

__all__ = ["Connection", "Database", "PoolBusy", "describe_url"]

#: The connection type ledger functions take.
Connection: TypeAlias = asyncpg.Connection


def describe_url(url: str) -> str:
    """Return ``url`` with its password hidden, for logs and start-up lines."""
    try:
        return database_url_parse(url).describe()
    except ConfigurationError:
        return _password_hidden(url)


def _password_hidden(url: str) -> str:
    """Return a URL Berth cannot parse with anything between ``:`` and ``@`` hidden."""
    return re.sub(r"(://[^:/?#@]*:)[^@/?#]*@", r"\1***@", url)


def _json_encode(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode()
    return orjson.dumps(value).decode()


async def _connection_init(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name, encoder=_json_encode, decoder=orjson.loads, schema="pg_catalog", format="text"
        )


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release: Berth leaves no session state on a connection
    (a transaction block always ends before release; session advisory locks and LISTEN use
    dedicated connections from :meth:`Database.connect`)."""


class PoolBusy(TimeoutError):
    """Every connection of the pool is busy and none came back in time; retry shortly."""


class Database:
    """An asyncpg pool on one PostgreSQL database, opened on first use.

    ``pool_wait_seconds`` bounds how long a caller waits for a connection while every
    connection of the pool is busy, and once a caller has waited that long in vain, the
    callers after it are refused at once (:class:`PoolBusy`) until a connection is free
    again: a pool that is not keeping up sheds at once instead of queueing callers for
    seconds. None (the default) waits up to the connect timeout and never refuses early.
    """

    def __init__(
        self,
        url: str,
        *,
        max_size: int = 10,
        connect_timeout_seconds: float = 5.0,
        pool_wait_seconds: float | None = None,
        application_name: str = "berth",
    ) -> None:
        self.url = url
        self.target: DatabaseUrl = database_url_parse(url)
        self.max_size = max_size
        self.connect_timeout_seconds = connect_timeout_seconds
        self.pool_wait_seconds = pool_wait_seconds
        self.application_name = application_name
        self._pool: asyncpg.Pool | None = None
        # The pool being closed: connections still out (a background wakeup's) go back to it,
        # which is what its close() waits for.
        self._closing: asyncpg.Pool | None = None
        # Set when a caller waited pool_wait_seconds for a busy pool in vain; cleared when a
        # connection is free or given out again.
        self._saturated = False
        # Two first requests at once must not both create a pool (one would leak).
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"Database({self.target.describe()!r})"

    async def open(self) -> None:
        """Create the pool (connections are made on first use)."""
        async with self._opening:
            if self._pool is not None:
                return
            self._pool = await asyncpg.create_pool(
                min_size=0,
                max_size=self.max_size,
                init=_connection_init,
                reset=_no_reset,
                **self._connect_args(self.application_name),
            )

    async def close(self) -> None:
        """Close every connection of the pool."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            self._closing = pool
            try:
                await pool.close()
            finally:
                self._closing = None

    def _free(self, pool: asyncpg.Pool) -> bool:
        """Return whether the pool has a free connection (or a free slot for a new one).

        Taking a free connection never waits (a holder still without its connection opens
        one within the connect timeout), so it is taken without a timeout: asyncpg's
        ``wait_for`` around an acquire costs about a tenth of a hot request's CPU. (``_queue``
        holds the pool's free holders.)
        """
        free = getattr(pool, "_queue", None)
        return free is not None and not free.empty()

    async def _acquire(self) -> asyncpg.Connection:
        if self._pool is None:
            await self.open()
        assert self._pool is not None
        if self._free(self._pool):
            self._saturated = False
            return await self._pool.acquire()
        return await self._acquire_busy(self._pool)

    async def _acquire_busy(self, pool: asyncpg.Pool) -> asyncpg.Connection:
        """Wait for a connection of a pool whose every connection is in use, or shed."""
        wait = self.pool_wait_seconds
        if wait is None:
            return await pool.acquire(timeout=self.connect_timeout_seconds)
        if self._saturated:
            raise PoolBusy(f"all {self.max_size} database connections are busy")
        try:
            conn = await pool.acquire(timeout=wait)
        except TimeoutError:
            self._saturated = True
            raise PoolBusy(
                f"all {self.max_size} database connections stayed busy for {wait:g} s"
            ) from None
        self._saturated = False
        return conn

    async def _release(self, conn: asyncpg.Connection) -> None:
        pool = self._pool or self._closing
        assert pool is not None
        await pool.release(conn)

    @asynccontextmanager
    async def transaction(self, *, isolation: str | None = None) -> AsyncIterator[Connection]:
        """Yield a connection inside a transaction that commits when the block exits.

        An exception inside the block rolls back; a failure of the COMMIT itself raises out
        of the block. Either way nothing is half-written.
        """
        conn = await self._acquire()
        try:
            async with conn.transaction(isolation=isolation):
                yield conn
        finally:
            await self._release(conn)

    def connection(self) -> AbstractAsyncContextManager[Connection]:
        """Return a context giving a connection in autocommit: each statement commits on its
        own."""
        pool = self._pool
        if pool is not None and self._free(pool):
            # The pool's own acquire context: no generator wrapper on the hot read path.
            self._saturated = False
            return pool.acquire()  # type: ignore[return-value]
        return self._connection_waiting()

    @asynccontextmanager
    async def _connection_waiting(self) -> AsyncIterator[Connection]:
        conn = await self._acquire()
        try:
            yield conn
        finally:
            await self._release(conn)

    def _connect_args(self, application_name: str) -> dict[str, Any]:
        return self.target.connect_args(
            application_name=application_name, timeout=self.connect_timeout_seconds
        )

    async def connect(self, *, application_name: str | None = None) -> Connection:
        """Open a dedicated connection outside the pool (LISTEN, session advisory locks);
        the caller closes it."""
        conn = await asyncpg.connect(
            **self._connect_args(application_name or self.application_name)
        )
        await _connection_init(conn)
        return conn
