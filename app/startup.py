"""Database resolution every command shares: the embedded PostgreSQL or BERTH_DATABASE_URL.

Without ``BERTH_DATABASE_URL`` the database is the embedded PostgreSQL in ``BERTH_DATA_DIR``
(default ``./.berth``): started (or reused) here, migrated to head, and stopped explicitly
when the command ends. With a URL Berth starts nothing: it checks that the database answers
and that its schema is at head, and otherwise stops with one line saying what to fix.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

from app.config import Settings
from app.db import Database, describe_url
from app.embedded import EmbeddedPostgres
from app.errors import ConfigurationError
from app.ledger.meta import database_ping
from app.schema import alembic_config, schema_current, schema_head, schema_upgrade


def _unreachable_why(exc: BaseException) -> str:
    """Return a few words on why a connection failed, from the innermost useful error."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in seen:
        name = type(err).__name__
        if isinstance(err, ConnectionRefusedError):
            return "connection refused"
        if isinstance(err, ssl.SSLCertVerificationError):
            why = str(err.verify_message).rstrip(".")
            return (f"the server's TLS certificate was refused: {why}; check sslrootcert (the "
                    "CA that signed it) and the host name")
        if isinstance(err, ssl.SSLError):
            return f"TLS failed: {err.reason or err}"
        if isinstance(err, socket.gaierror):
            return "host name not found"
        if isinstance(err, TimeoutError | asyncio.TimeoutError):
            return "connection timed out"
        if name in {
            "InvalidPasswordError",
            "InvalidAuthorizationSpecificationError",
            "InvalidCatalogNameError",
            "TooManyConnectionsError",
            "CannotConnectNowError",
        }:
            return str(err).strip().splitlines()[0]
        if isinstance(err, FileNotFoundError):
            return "no server socket at that path"
        if isinstance(err, OSError) and err.strerror:
            return err.strerror.lower()
    last = seen[-1]
    text = str(last).strip().splitlines()[0] if str(last).strip() else type(last).__name__
    return text[:160]


def _unreachable(url: str, exc: BaseException) -> ConfigurationError:
    return ConfigurationError(
        f"database at {describe_url(url)} is unreachable ({_unreachable_why(exc)}); "
        "check BERTH_DATABASE_URL"
    )


async def database_check(url: str, *, connect_timeout_seconds: float = 5.0) -> None:
    """Check that ``url`` answers and its schema is at head, else raise ConfigurationError."""
    db = Database(url, max_size=1, connect_timeout_seconds=connect_timeout_seconds)
    try:
        async with db.connection() as conn:
            current = await schema_current(conn)
    except ConfigurationError:
        raise
    except Exception as exc:
        raise _unreachable(url, exc) from None
    finally:
        await db.close()
    schema_ensure_head(current, url=url)


def schema_ensure_head(current: str | None, *, url: str) -> None:
    """Raise ConfigurationError unless ``current`` is the head revision."""
    head = schema_head()
    if current == head:
        return
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    where = describe_url(url)
    if current is None:
        raise ConfigurationError(
            f"database at {where} has no Berth schema (head is {head}): run `berth migrate`"
        )
    try:
        known = ScriptDirectory.from_config(alembic_config()).get_revision(current) is not None
    except CommandError:
        known = False
    if not known:
        raise ConfigurationError(
            f"database at {where} is at schema {current}, which this Berth does not know "
            f"(its head is {head}): upgrade Berth, or point BERTH_DATABASE_URL elsewhere"
        )
    raise ConfigurationError(
        f"database schema at {where} is at {current}, head is {head}: run `berth migrate`"
    )


async def database_migrate(url: str, *, connect_timeout_seconds: float = 5.0) -> str:
    """Upgrade the database at ``url`` to head and return the revision it is at."""
    db = Database(url, max_size=1, connect_timeout_seconds=connect_timeout_seconds)
    try:
        try:
            async with db.connection() as conn:
                await database_ping(conn)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise _unreachable(url, exc) from None
        await schema_upgrade(url, connect_timeout_seconds=connect_timeout_seconds)
        async with db.connection() as conn:
            current = await schema_current(conn)
    finally:
        await db.close()
    assert current is not None
    return current


class EmbeddedDatabaseMissing(ConfigurationError):
    """The data directory holds no embedded database, and this command does not create one."""


def settings_for(settings: Settings, data_dir: str | Path | None) -> Settings:
    """Return ``settings`` with ``--data-dir`` (when given) in place of BERTH_DATA_DIR."""
    if data_dir is None:
        return settings
    return settings.model_copy(update={"data_dir": Path(data_dir)})


def database_resolve(
    settings: Settings, *, migrate: bool, create: bool = True
) -> tuple[str, EmbeddedPostgres | None]:
    """Return the database URL to use and the embedded server behind it (None for a URL).

    The embedded server is started (or reused) and always migrated to head: it is Berth's
    own. Without ``create``, a data directory that holds no database yet is refused with one
    line naming the directory and the fix, instead of quietly making a new empty database
    that no server uses (``berth keys``, ``berth reconcile``). A ``BERTH_DATABASE_URL``
    database is upgraded when ``migrate`` is true, else only checked: unreachable or not at
    head raises ConfigurationError with one line. The caller owns the returned server and
    must ``stop()`` it. Call this outside any running event loop.
    """
    timeout = settings.db_connect_timeout_seconds
    if settings.database_url:
        if migrate:
            asyncio.run(database_migrate(settings.database_url, connect_timeout_seconds=timeout))
        else:
            asyncio.run(database_check(settings.database_url, connect_timeout_seconds=timeout))
        return settings.database_url, None
    server = EmbeddedPostgres(settings.data_dir)
    if not create and not server.initialised:
        raise EmbeddedDatabaseMissing(
            f"no embedded database in {server.data_dir}: pass --data-dir (or set "
            "BERTH_DATA_DIR) to the directory `berth serve` uses, or set BERTH_DATABASE_URL"
        )
    try:
        url = server.start()
        asyncio.run(database_migrate(url, connect_timeout_seconds=timeout))
    except BaseException:
        server.stop()
        raise
    return url, server


def database_describe(url: str, server: EmbeddedPostgres | None) -> str:
    """Return how the database is named in start-up lines (password hidden)."""
    if server is None:
        return describe_url(url)
    return f"embedded PostgreSQL in {server.data_dir} (Unix socket only, no TCP)"


async def schema_revision(url: str, *, connect_timeout_seconds: float = 5.0) -> str | None:
    """Return the schema revision of the database at ``url`` (None on an empty one)."""
    db = Database(url, max_size=1, connect_timeout_seconds=connect_timeout_seconds)
    try:
        async with db.connection() as conn:
            return await schema_current(conn)
    finally:
        await db.close()
