"""LISTEN for wakeups on a dedicated asyncpg connection (not one from the engine's pool)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.engine import URL

from app.ledger.wakeups import CHANNEL, WakeSource

log = logging.getLogger("berth.reconciler")

_SOURCES = {s.value for s in WakeSource}


def asyncpg_dsn(url: URL) -> str:
    """Return a plain ``postgresql://`` DSN for asyncpg from an engine URL."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class WakeupListener:
    """Deliver each notification's source to ``on_wakeup``; reconnect when the link drops."""

    def __init__(self, dsn: str, on_wakeup: Callable[[WakeSource], None]) -> None:
        self._dsn = dsn
        self._on_wakeup = on_wakeup
        self._conn: asyncpg.Connection | None = None

    @property
    def connected(self) -> bool:
        """Return whether the LISTEN connection is open."""
        return self._conn is not None and not self._conn.is_closed()

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        # Unknown payloads still wake the loop (as a tick): never drop a wakeup.
        source = WakeSource(payload) if payload in _SOURCES else WakeSource.TICK
        self._on_wakeup(source)

    async def ensure(self) -> bool:
        """Connect and LISTEN if not connected; return True when a (re)connection happened."""
        if self.connected:
            return False
        await self.close()
        try:
            conn = await asyncpg.connect(self._dsn, timeout=10,
                                         server_settings={"application_name": "berth-listen"})
            await conn.add_listener(CHANNEL, self._notified)
        except Exception as exc:  # the tick covers until the next try
            log.warning("wakeup listener cannot connect", extra={"error": type(exc).__name__})
            return False
        self._conn = conn
        return True

    async def close(self) -> None:
        """Stop listening."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.remove_listener(CHANNEL, self._notified)
                await conn.close(timeout=5)
            except Exception:  # closing anyway
                conn.terminate()
