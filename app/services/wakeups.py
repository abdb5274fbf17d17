"""Waking reconcilers after submissions, coalesced.

A submission commits without a NOTIFY (see :mod:`app.ledger.tasks`), then calls
:func:`submitted`. One ``submitted`` wakeup is in flight per database at a time: a
submission that commits while one is being sent asks for one more, sent as soon as the
first is done. Every submission is therefore followed by a wakeup sent after its commit,
and under load the API sends one NOTIFY per round trip instead of one per task, so
submissions no longer queue on PostgreSQL's notification lock.

If the process dies between a commit and its wakeup, or the wakeup fails, the task waits
for the reconcilers' tick (``BERTH_TICK_SECONDS``, 5 s by default): a wakeup only makes
placement prompt, it is never what makes it happen.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable

from app.db import Database, PoolBusy
from app.ledger.wakeups import WakeSource, wakeup_notify
from app.logs import LogSummary

__all__ = ["submitted", "submissions_follow"]

log = logging.getLogger("berth.wakeups")
#: Under overload every wakeup may fail (the pool is busy): one line per interval.
_FAILED_LOG = LogSummary(log, "could not wake reconcilers after a submission")


class _Waker:
    """The ``submitted`` wakeups of one database: at most one in flight, one more asked."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def poke(self) -> None:
        if self._task is not None:
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while True:
                self._again = False
                async with self._db.connection() as conn:
                    await wakeup_notify(conn, source=WakeSource.SUBMITTED)
                if not self._again:
                    return
        except Exception as exc:  # a lost wakeup only delays placement to the tick
            # A busy pool or a lost database is expected under overload: no traceback.
            expected = isinstance(exc, PoolBusy | OSError) or type(
                exc).__module__.startswith("asyncpg")
            _FAILED_LOG.note(type(exc).__name__, exc_info=not expected)
        finally:
            self._task = None


_wakers: weakref.WeakKeyDictionary[Database, _Waker] = weakref.WeakKeyDictionary()
_followers: weakref.WeakKeyDictionary[Database, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary())


def submissions_follow(db: Database, callback: Callable[[], None]) -> None:
    """Call ``callback`` (in this process, at once) after each submission to ``db`` commits:
    the process's watch hub reads them without waiting for the wakeup's round trip."""
    _followers.setdefault(db, []).append(callback)


def submitted(db: Database) -> None:
    """Wake reconcilers (soon, in the background) for tasks committed just now."""
    for callback in _followers.get(db, ()):
        callback()
    waker = _wakers.get(db)
    if waker is None:
        waker = _wakers[db] = _Waker(db)
    waker.poke()
