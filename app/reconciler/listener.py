"""LISTEN for wakeups on a dedicated connection (``Database.connect``, not one of the pool)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from app.db import Connection, Database
from app.ledger.wakeups import CHANNEL, Wakeup

log = logging.getLogger("berth.reconciler")

#: ``application_name`` of the LISTEN connection, as ``pg_stat_activity`` shows it.
APPLICATION_NAME = "berth-listen"


class WakeupListener:
    """Deliver each notification to ``on_wakeup`` as a :class:`Wakeup`; reconnect when the
    link drops."""

    def __init__(self, db: Database, on_wakeup: Callable[[Wakeup], None]) -> None:
        self._db = db
        self._on_wakeup = on_wakeup
        self._conn: Connection | None = None

    @property
    def connected(self) -> bool:
        """Return whether the LISTEN connection is open."""
        return self._conn is not None and not self._conn.is_closed()

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        # Unknown payloads still wake the loop (as a broad tick): never drop a wakeup.
        self._on_wakeup(Wakeup.parse(payload))

    async def ensure(self) -> bool:
        """Connect and LISTEN if not connected; return True when a (re)connection happened."""
        if self.connected:
            return False
        await self.close()
        conn: Connection | None = None
        try:
            conn = await self._db.connect(application_name=APPLICATION_NAME)
            await conn.add_listener(CHANNEL, self._notified)
        except Exception as exc:  # the tick covers until the next try
            if conn is not None:
                conn.terminate()
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
