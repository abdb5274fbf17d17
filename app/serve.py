"""``berth serve`` and ``berth migrate``, and the database resolution every command shares.

Without ``BERTH_DATABASE_URL`` the database is the embedded PostgreSQL in ``BERTH_DATA_DIR``
(default ``./.berth``): started (or reused) here, migrated to head, and stopped explicitly
when the command ends. With a URL Berth starts nothing: it checks that the database answers
and that its schema is at head, and otherwise stops with one line saying what to fix.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from pathlib import Path

from app.config import Settings, get_settings
from app.db import describe_url, make_engine
from app.embedded import EmbeddedPostgres
from app.errors import ConfigurationError
from app.schema import alembic_config, schema_current, schema_head, schema_upgrade


def _say(line: str) -> None:
    print(f"berth: {line}", flush=True)


# --- database resolution ------------------------------------------------------------------


def _unreachable_why(exc: BaseException) -> str:
    """Return a few words on why a connection failed, from the innermost useful error."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = getattr(cur, "orig", None) or cur.__cause__ or cur.__context__
    for err in seen:
        name = type(err).__name__
        if isinstance(err, ConnectionRefusedError):
            return "connection refused"
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


async def database_check(url: str, *, connect_timeout_seconds: float = 5.0) -> None:
    """Check that ``url`` answers and its schema is at head, else raise ConfigurationError."""
    engine = make_engine(
        url, pool_size=1, max_overflow=0, connect_timeout_seconds=connect_timeout_seconds
    )
    try:
        async with engine.connect() as conn:
            current = await schema_current(conn)
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"database at {describe_url(url)} is unreachable ({_unreachable_why(exc)}); "
            "check BERTH_DATABASE_URL"
        ) from None
    finally:
        await engine.dispose()
    schema_ensure_head(current, url=url)


def schema_ensure_head(current: str | None, *, url: str) -> None:
    """Raise ConfigurationError unless ``current`` is the head revision."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    head = schema_head()
    if current == head:
        return
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
    engine = make_engine(
        url, pool_size=1, max_overflow=0, connect_timeout_seconds=connect_timeout_seconds
    )
    try:
        try:
            async with engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        except Exception as exc:
            raise ConfigurationError(
                f"database at {describe_url(url)} is unreachable ({_unreachable_why(exc)}); "
                "check BERTH_DATABASE_URL"
            ) from None
        await schema_upgrade(engine)
        async with engine.connect() as conn:
            current = await schema_current(conn)
    finally:
        await engine.dispose()
    assert current is not None
    return current


def database_resolve(settings: Settings, *, migrate: bool) -> tuple[str, EmbeddedPostgres | None]:
    """Return the database URL to use and the embedded server behind it (None for a URL).

    The embedded server is started (or reused) and always migrated to head: it is Berth's
    own. A ``BERTH_DATABASE_URL`` database is upgraded when ``migrate`` is true, else only
    checked: unreachable or not at head raises ConfigurationError with one line. The caller
    owns the returned server and must ``stop()`` it. Call this outside any running event loop.
    """
    timeout = settings.db_connect_timeout_seconds
    if settings.database_url:
        if migrate:
            asyncio.run(database_migrate(settings.database_url, connect_timeout_seconds=timeout))
        else:
            asyncio.run(database_check(settings.database_url, connect_timeout_seconds=timeout))
        return settings.database_url, None
    server = EmbeddedPostgres(settings.data_dir)
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


# --- berth migrate ------------------------------------------------------------------------


def migrate() -> int:
    """Upgrade BERTH_DATABASE_URL (or the embedded database) to head and print the revision."""
    settings = get_settings()
    url, server = database_resolve(settings, migrate=True)
    try:
        current = asyncio.run(_revision(url, settings))
    finally:
        if server is not None:
            server.stop()
    _say(f"database {database_describe(url, server)} is at schema revision {current} (head)")
    return 0


async def _revision(url: str, settings: Settings) -> str | None:
    engine = make_engine(
        url, pool_size=1, max_overflow=0,
        connect_timeout_seconds=settings.db_connect_timeout_seconds,
    )
    try:
        async with engine.connect() as conn:
            return await schema_current(conn)
    finally:
        await engine.dispose()


# --- berth serve --------------------------------------------------------------------------


def _socket_listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket, or raise ConfigurationError saying why it cannot."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); check --host or BERTH_HOST"
        ) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"cannot listen on {host}:{port} ({(exc.strerror or str(exc)).lower()}); "
            "choose another --port or BERTH_PORT"
        ) from None
    sock.set_inheritable(True)
    return sock


async def _bootstrap_key_create(url: str, settings: Settings) -> str | None:
    """Create the bootstrap admin key on a database without one and return it; else None."""
    from app.ledger.keys import api_key_bootstrap

    engine = make_engine(
        url, pool_size=1, max_overflow=0,
        connect_timeout_seconds=settings.db_connect_timeout_seconds,
    )
    try:
        async with engine.begin() as conn:
            return await api_key_bootstrap(conn)
    finally:
        await engine.dispose()


class _Interrupts:
    """SIGINT/SIGTERM before uvicorn serves abort the start; once it is stopping, ignore them.

    uvicorn installs its own handlers while it serves and, when it returns, restores these
    and re-raises the signal it caught; ignoring it then lets ``serve()`` stop the embedded
    PostgreSQL and return instead of dying on SIGTERM's default action.
    """

    def __init__(self) -> None:
        self.stopping = False
        self.server: object | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: object) -> None:
        if self.stopping or getattr(self.server, "should_exit", False):
            return
        raise KeyboardInterrupt


def serve(
    host: str | None = None, port: int | None = None, data_dir: str | Path | None = None
) -> int:
    """Run the API (and its lifespan's reconciler) until SIGINT or SIGTERM; return 0."""
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if data_dir is not None:
        overrides["data_dir"] = Path(data_dir)
    settings = get_settings().model_copy(update=overrides)
    if not 0 <= settings.port <= 65535:
        raise ConfigurationError(f"port {settings.port} is out of range 0..65535")

    sock = _socket_listen(settings.host, settings.port)
    interrupts = _Interrupts()
    server: EmbeddedPostgres | None = None
    try:
        interrupts.install()
        url, server = database_resolve(settings, migrate=False)
        key = asyncio.run(_bootstrap_key_create(url, settings))
        if key is not None:
            _say("new database: bootstrap admin API key (printed once, store it now):")
            print(key, flush=True)
        bound_host, bound_port = sock.getsockname()[:2]
        shown_host = f"[{bound_host}]" if ":" in bound_host else bound_host
        _say(f"listening on http://{shown_host}:{bound_port}")
        _say(f"database {database_describe(url, server)}")
        asyncio.run(_serve(settings.model_copy(update={"database_url": url}), sock, interrupts))
    finally:
        interrupts.stopping = True
        sock.close()
        if server is not None:
            owned = server.owned
            server.stop()
            if owned:
                _say("stopped the embedded PostgreSQL")
        interrupts.restore()
    return 0


async def _serve(settings: Settings, sock: socket.socket, interrupts: _Interrupts) -> None:
    import uvicorn

    from app.api.timeouts import head_limited_protocol
    from app.logs import logging_configure, uvicorn_log_config
    from app.main import create_app

    logging_configure(settings.log_level)
    config = uvicorn.Config(
        create_app(settings),
        log_config=uvicorn_log_config(),
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=10,
        server_header=False,
        # httptools, with a deadline and a size bound on each request head (app/api/timeouts.py)
        http=head_limited_protocol(settings.request_header_timeout_seconds),
    )
    server = uvicorn.Server(config)
    interrupts.server = server
    await server.serve(sockets=[sock])
    if not server.started:
        raise ConfigurationError("the HTTP server did not start; see the log lines above")
