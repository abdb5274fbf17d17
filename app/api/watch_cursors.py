"""Watch cursors in API answers: sealing positions, and the ``watchCursor`` of lists.

A list (``GET /v1/tasks``, ``/v1/pools``, a runtime's leases) carries ``watchCursor``: the
feed's position taken *before* the list was read, so watching from it replays every change
the list may not show (and perhaps a few it does: the feed is at least once).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache

from fastapi import Request

from app.ledger.watch import FeedPosition
from app.services.tokens import Tokens
from app.services.watch import WatchCursors
from app.services.watch_hub import feed_position

__all__ = ["cursor_of", "list_watch_cursor", "watch_cursors"]


async def watch_cursors(request: Request) -> WatchCursors:
    """Return the cursor codec of this deployment (its secret and history retention)."""
    hours = request.app.state.settings.finished_task_retention_hours
    tokens = await request.app.state.tokens.get()
    return _cursors(tokens, hours)


@lru_cache(maxsize=4)
def _cursors(tokens: Tokens, hours: float) -> WatchCursors:
    return WatchCursors(tokens, timedelta(hours=hours) if hours else None)


@lru_cache(maxsize=8192)
def _sealed(cursors: WatchCursors, position: FeedPosition, second: int) -> str:
    """Return the cursor of a position (shared by every watcher that is given it)."""
    return cursors.seal(position, now=datetime.fromtimestamp(second, UTC))


def cursor_of(cursors: WatchCursors, position: FeedPosition) -> str:
    """Return the cursor of ``position``, made now (to the second)."""
    return _sealed(cursors, position, int(datetime.now(UTC).timestamp()))


async def list_watch_cursor(request: Request) -> str:
    """Return the cursor of the present, for a list about to be read: the watch hub's
    position while it follows the log (older is as good, only less fresh), else read."""
    cursors = await watch_cursors(request)
    hub = getattr(request.app.state, "watch_hub", None)
    present = hub.present if hub is not None else None
    return cursor_of(cursors, present or await feed_position(request.app.state.db))
