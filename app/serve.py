"""``berth serve`` and ``berth migrate``: the composition root of a Berth process.

``berth serve`` resolves the database (:mod:`app.startup`), creates the bootstrap key on a new
database, builds the API (:func:`app.main.create_app`, which starts nothing of its own) and,
unless ``BERTH_RECONCILER_ENABLED=false``, hands it an in-process reconciler as a background
service. ``berth reconcile`` composes a reconciler alone (:mod:`app.reconciler.process`).
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import threading
from pathlib import Path

from app.config import Settings, get_settings
from app.db import Database
from app.embedded import EmbeddedPostgres
from app.errors import ConfigurationError
from app.startup import database_describe, database_resolve, schema_revision, settings_for


def _say(line: str) -> None:
    print(f"berth: {line}", flush=True)


# --- berth migrate ------------------------------------------------------------------------


def migrate(data_dir: str | Path | None = None) -> int:
    """Upgrade BERTH_DATABASE_URL (or the embedded database) to head and print the revision.

    A data directory without a database gets a new one, and the output says so: migrate is
    how an installation prepares its database before the first ``berth serve``.
    """
    settings = settings_for(get_settings(), data_dir)
    created = None
    if settings.database_url is None:
        embedded = EmbeddedPostgres(settings.data_dir)
        created = None if embedded.initialised else embedded.data_dir
    url, server = database_resolve(settings, migrate=True)
    if created is not None:
        _say(f"created a new embedded database in {created} (it has no API keys yet: "
             "`berth serve` prints the bootstrap admin key)")
    try:
        current = asyncio.run(
            schema_revision(url, connect_timeout_seconds=settings.db_connect_timeout_seconds)
        )
    finally:
        if server is not None:
            server.stop()
    _say(f"database {database_describe(url, server)} is at schema revision {current} (head)")
    return 0


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


#: A bootstrap key given in a file: Berth's prefix and 32 to 256 URL-safe characters (a key
#: Berth generates has 43; ``berth_$(openssl rand -hex 32)`` has 64).
_KEY_GIVEN = re.compile(r"berth_[A-Za-z0-9_-]{32,256}")


def bootstrap_key_read(path: Path) -> str:
    """Return the API key held in ``path``, or raise ConfigurationError (never showing it)."""
    where = f"BERTH_BOOTSTRAP_ADMIN_KEY_FILE {path}"
    try:
        key = path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        key = ""
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read {where} ({(exc.strerror or str(exc)).lower()}); "
            "mount the Secret there or unset the variable"
        ) from None
    if not _KEY_GIVEN.fullmatch(key):
        raise ConfigurationError(
            f"{where} does not hold an API key: it must be `berth_` and 32 to 256 URL-safe "
            "characters (A-Z a-z 0-9 - _), e.g. berth_$(openssl rand -hex 32)"
        )
    return key


async def _bootstrap_key_create(
    url: str, settings: Settings, *, key: str | None = None
) -> tuple[str | None, bool]:
    """Create the bootstrap admin key (``key``, else a random one) on a database without one.

    Return the key created (None when the database already had its bootstrap key) and whether
    ``key`` is a live key of the database afterwards.
    """
    from app.ledger.keys import api_key_bootstrap, api_key_get

    db = Database(url, max_size=1, connect_timeout_seconds=settings.db_connect_timeout_seconds)
    try:
        async with db.transaction() as conn:
            created = await api_key_bootstrap(conn, key=key)
            live = key is not None and await api_key_get(conn, key=key) is not None
            return created, live
    finally:
        await db.close()


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
    """Run the API (and an in-process reconciler) until SIGINT or SIGTERM; return 0."""
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = settings_for(get_settings(), data_dir).model_copy(update=overrides)
    if not 0 <= settings.port <= 65535:
        raise ConfigurationError(f"port {settings.port} is out of range 0..65535")
    key_file = settings.bootstrap_admin_key_file
    given_key = bootstrap_key_read(key_file) if key_file is not None else None

    sock = _socket_listen(settings.host, settings.port)
    interrupts = _Interrupts()
    server: EmbeddedPostgres | None = None
    try:
        interrupts.install()
        url, server = database_resolve(settings, migrate=False)
        key, given_live = asyncio.run(_bootstrap_key_create(url, settings, key=given_key))
        if given_key is None and key is not None:
            _say("new database: bootstrap admin API key (printed once, store it now):")
            print(key, flush=True)
        elif key is not None:
            _say(f"new database: stored the bootstrap admin API key of {key_file} (its hash)")
        elif given_key is not None and not given_live:
            _say(
                f"warning: the key in {key_file} is not a live key of this database, whose "
                "bootstrap admin key was stored before (and may be revoked since); "
                "create keys with `berth keys create`"
            )
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
    from app.reconciler.process import reconciler_background

    logging_configure(settings.log_level)
    background = [reconciler_background(settings)] if settings.reconciler_enabled else []
    config = uvicorn.Config(
        create_app(settings, background=background),
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
