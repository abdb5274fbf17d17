"""One listener per process fanning the event logs out to every watcher.

The hub holds one dedicated connection that ``LISTEN``s on ``berth_watch`` (the event logs'
triggers notify it at commit, except for admissions) and on the reconcilers' wakeup channel
(which every submission is followed by). Woken, it reads the logs once from its own position — one
read for every watcher of the process — and hands each watcher the events its scope admits,
into that watcher's bounded buffer; then it moves its position on. Watchers that were given
nothing are not woken: while they are in step with the hub, the hub's position is theirs.

A watcher whose buffer is full is not buffered further: it is marked behind, and reads the
event log itself from its own cursor up to the hub's position (:func:`watch_session`), then
follows the hub again. A watcher whose cursor comes from another process, ahead of this
hub, waits for the hub to pass it. When the database goes away the hub ends every session
with its last cursor (the client resumes from it elsewhere, or here once the hub is back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.db import Connection, Database
from app.errors import BerthError
from app.ledger.wakeups import CHANNEL as WAKEUP_CHANNEL
from app.ledger.watch import FeedPosition, watch_leases_of, watch_position_now, watch_read
from app.logs import LogSummary
from app.services.wakeups import submissions_follow
from app.services.watch import WatchEvent, WatchFilter, WatchScope, events_of, lease_rows_wanted

__all__ = ["WatchHub", "WatchLimit", "WatchStep", "feed_read", "watch_session"]

log = logging.getLogger("berth.watch")
#: When the database goes, every session ends at once: one line per interval for them all.
_SESSION_LOST_LOG = LogSummary(log, "watch session lost the database")

#: Rows one read of the event log returns at most, and how many ids ahead it looks.
READ_LIMIT = 1000
READ_WINDOW = 50_000
#: The hub reads this often even without a notification (one missed, or none sent).
TICK_SECONDS = 1.0
#: Backoff of the hub's reconnection after the database went away.
RECONNECT_SECONDS = 1.0
#: The LISTEN channel the event logs' triggers notify (for every change but an admission).
CHANNEL = "berth_watch"
#: The channels that wake the hub: admissions are announced by the reconcilers' wakeup.
CHANNELS = (CHANNEL, WAKEUP_CHANNEL)


class WatchLimit(BerthError):
    """Too many watch connections; retry shortly."""

    status = 429
    title = "Too Many Requests"
    type_slug = "watch-limit"


@dataclass(frozen=True, slots=True)
class FeedBatch:
    """The events of one read, the position it reached, whether more were already there,
    and how many log rows it read (rows without a public event included)."""

    events: list[WatchEvent]
    position: FeedPosition
    more: bool
    rows: int


async def feed_read(
    db: Database, *, after: FeedPosition, until: FeedPosition | None, limit: int = READ_LIMIT
) -> FeedBatch:
    """Return the events after ``after`` up to ``until`` (None: now), on a pool connection."""
    async with db.connection() as conn:
        return await feed_read_on(conn, after=after, until=until, limit=limit)


async def feed_read_on(
    conn: Connection, *, after: FeedPosition, until: FeedPosition | None,
    limit: int = READ_LIMIT,
) -> FeedBatch:
    """Return the events after ``after`` up to ``until`` (None: now), read on ``conn``."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        read = await watch_read(conn, after=after, until=until, limit=limit, window=READ_WINDOW)
        leases = await watch_leases_of(conn, task_ids=lease_rows_wanted(read))
    events = events_of(read, after=after, leases=leases)
    return FeedBatch(events, read.position, read.more, len(read.rows))


async def feed_position(db: Database) -> FeedPosition:
    """Return the present position of the feed."""
    async with db.connection() as conn:
        return await watch_position_now(conn)


class Subscription:
    """One watcher's place in the hub: its scope and a bounded buffer of event batches."""

    __slots__ = ("active", "broken", "buffer", "key", "overflowed", "scope", "size", "wake")

    def __init__(self, scope: WatchScope, key: Any, size: int) -> None:
        self.scope = scope
        self.key = key
        self.size = size
        self.buffer: deque[tuple[FeedPosition, list[WatchEvent]]] = deque()
        self.wake = asyncio.Event()
        self.overflowed = False
        self.broken = False
        self.active = True

    def offer(self, end: FeedPosition, events: list[WatchEvent]) -> None:
        """Buffer a batch of this watcher's events, or mark it behind when full."""
        if self.overflowed:
            return
        if len(self.buffer) >= self.size:
            self.overflowed = True
            self.buffer.clear()
        else:
            self.buffer.append((end, events))
        self.wake.set()

    def resync(self) -> None:
        """Forget what is buffered: the watcher reads the log itself up to the hub."""
        self.buffer.clear()
        self.overflowed = False
        self.wake.clear()


def _routes(scope: WatchScope) -> list[tuple[str, str]]:
    """Return the routing keys under which a watcher of ``scope`` is found."""
    if scope.role == "admin":
        return [("admin", "")]
    if scope.role == "tenant":
        return [("tenant", t) for t in scope.tenant_ids]
    if scope.role == "runtime":
        return [("runtime", r) for r in scope.runtime_instance_ids]
    return [("operator", scope.subject)]


def _event_routes(event: WatchEvent) -> list[tuple[str, str]]:
    """Return the routing keys of the watchers that may see ``event``."""
    family = event.family
    routes = [("admin", "")]
    if family == "task" and event.tenant_id is not None:
        routes.append(("tenant", event.tenant_id))
    if family == "lease" and event.runtime_instance_id is not None:
        routes.append(("runtime", event.runtime_instance_id))
    if family in ("lease", "pool"):
        routes += [("operator", o) for o in event.operators]
    return routes


@dataclass
class HubLimits:
    """How many watchers one process and one key may have, and each one's buffer."""

    max_watchers: int = 10_000
    max_per_key: int = 1_000
    buffer_batches: int = 64


class WatchHub:
    """The process's one listener and the watchers it feeds."""

    def __init__(self, db: Database, limits: HubLimits | None = None,
                 *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.db = db
        self.limits = limits or HubLimits()
        self.clock = clock
        self.position: FeedPosition | None = None
        self.broken = False
        self._routes: dict[tuple[str, str], set[Subscription]] = {}
        self._per_key: dict[Any, int] = {}
        self._count = 0
        self._advanced = asyncio.Event()
        self._notified = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Submissions do not notify the feed's channel: this process's own wake the hub here.
        submissions_follow(db, self._notified.set)

    @property
    def present(self) -> FeedPosition | None:
        """Return a recent position every committed event is within, if the hub follows
        the log (it reads at least every second while it has watchers), else None."""
        return self.position if self._count and not self.broken else None

    @property
    def watchers(self) -> int:
        """Return how many watchers are subscribed."""
        return self._count

    def subscribe(self, scope: WatchScope, *, key: Any) -> Subscription:
        """Add a watcher; raise WatchLimit past the per-process or per-key limit."""
        if self._count >= self.limits.max_watchers:
            raise WatchLimit(
                f"this process serves {self.limits.max_watchers} watch connections, its limit "
                "(BERTH_WATCH_MAX_WATCHERS); retry in a few seconds",
                extra={"headers": {"Retry-After": "5"}})
        if self._per_key.get(key, 0) >= self.limits.max_per_key:
            raise WatchLimit(
                f"this key holds {self.limits.max_per_key} watch connections on this process, "
                "its limit (BERTH_WATCH_MAX_WATCHERS_PER_KEY); close one or retry later",
                extra={"headers": {"Retry-After": "5"}})
        sub = Subscription(scope, key, self.limits.buffer_batches)
        for route in _routes(scope):
            self._routes.setdefault(route, set()).add(sub)
        self._per_key[key] = self._per_key.get(key, 0) + 1
        self._count += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="watch-hub")
        # Read soon: the new watcher may start past the hub's position.
        self._notified.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Remove a watcher (once; again does nothing)."""
        if not sub.active:
            return
        sub.active = False
        for route in _routes(sub.scope):
            subs = self._routes.get(route)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._routes[route]
        left = self._per_key[sub.key] - 1
        if left:
            self._per_key[sub.key] = left
        else:
            del self._per_key[sub.key]
        self._count -= 1

    async def advanced(self, seconds: float) -> None:
        """Wait until the hub's position moves (or ``seconds`` pass)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._advanced.wait(), seconds)

    async def stop(self) -> None:
        """Stop listening and end every session."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._break()

    def _break(self) -> None:
        self.broken = True
        self.position = None
        for subs in self._routes.values():
            for sub in subs:
                sub.broken = True
                sub.wake.set()
        self._advance()

    def _advance(self) -> None:
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watch listener lost the database", extra={
                    "error": type(exc).__name__})
                self._break()
                await asyncio.sleep(RECONNECT_SECONDS)

    async def _listen(self) -> None:
        conn = await self.db.connect(application_name="berth-watch")
        try:
            for channel in CHANNELS:
                await conn.add_listener(channel, lambda *_: self._notified.set())
            self.position = await watch_position_now(conn)
            self.broken = False
            self._advance()
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._notified.wait(), TICK_SECONDS)
                self._notified.clear()
                if conn.is_closed():
                    raise ConnectionError("the listening connection closed")
                if self._count:
                    await self._read_all(conn)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(conn.close(timeout=1))

    async def _read_all(self, conn: Connection) -> None:
        # On the listening connection: the hub never waits for (or is refused) a connection
        # of the pool that serves the API's requests.
        more = True
        while more and self.position is not None:
            batch = await feed_read_on(conn, after=self.position, until=None)
            more = batch.more
            self._fan_out(batch.position, batch.events)

    def _fan_out(self, end: FeedPosition, events: list[WatchEvent]) -> None:
        """Hand each watcher its events, then move the hub's position (no await between)."""
        batches: dict[Subscription, list[WatchEvent]] = {}
        for event in events:
            for route in _event_routes(event):
                for sub in self._routes.get(route, ()):
                    if sub.scope.admits(event):
                        batches.setdefault(sub, []).append(event)
        for sub, mine in batches.items():
            sub.offer(end, mine)
        self.position = end
        self._advance()


@dataclass(frozen=True, slots=True)
class WatchStep:
    """What a session has for its client: events (maybe none), the cursor after them, and
    why the session ends here (None: it goes on)."""

    events: list[WatchEvent]
    position: FeedPosition
    end: str | None = None


async def watch_session(
    hub: WatchHub, sub: Subscription, *, start: FeedPosition, filt: WatchFilter,
    idle_seconds: float,
) -> AsyncIterator[WatchStep]:
    """Yield the subscribed watcher's events after ``start``, in steps; a step without
    events comes after ``idle_seconds`` of nothing (its position may have moved on).

    Ends with a step naming why (``database-unavailable``) when the hub loses the
    database or a read of the log fails; the caller unsubscribes.
    """
    cursor = start
    try:
        while True:
            if sub.broken or (hub.broken and hub.position is None):
                yield WatchStep([], cursor, "database-unavailable")
                return
            hub_at = hub.position
            sub.resync()
            if hub_at is None or (cursor != hub_at and not cursor.within(hub_at)):
                # The hub is starting, or this cursor is ahead of it (another process's).
                await hub.advanced(idle_seconds)
                if hub.position == hub_at:
                    yield WatchStep([], cursor)
                continue
            while cursor != hub_at:
                batch = await feed_read(hub.db, after=cursor, until=hub_at)
                cursor = batch.position
                yield WatchStep(_kept(batch.events, sub.scope, filt), cursor)
            async for step in _follow(hub, sub, cursor, filt, idle_seconds):
                cursor = step.position
                yield step
    except (OSError, TimeoutError) as exc:
        _SESSION_LOST_LOG.note(type(exc).__name__)
        yield WatchStep([], cursor, "database-unavailable")
    except Exception as exc:
        if not _database_fault(exc):
            raise
        _SESSION_LOST_LOG.note(type(exc).__name__)
        yield WatchStep([], cursor, "database-unavailable")


def _database_fault(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("asyncpg") or type(exc).__name__ == "PoolBusy"


async def _follow(
    hub: WatchHub, sub: Subscription, cursor: FeedPosition, filt: WatchFilter,
    idle_seconds: float,
) -> AsyncIterator[WatchStep]:
    """Yield the hub's batches for ``sub`` while it keeps up; return when it fell behind."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sub.wake.wait(), idle_seconds)
        sub.wake.clear()
        if sub.overflowed or sub.broken:
            return
        if not sub.buffer:
            if hub.position is not None:
                cursor = hub.position
            yield WatchStep([], cursor)
            continue
        while sub.buffer:
            end, events = sub.buffer.popleft()
            cursor = end
            yield WatchStep(_kept(events, sub.scope, filt), end)
        if hub.position is not None and not sub.buffer:
            cursor = hub.position


def _kept(events: list[WatchEvent], scope: WatchScope, filt: WatchFilter) -> list[WatchEvent]:
    return [e for e in events if scope.admits(e) and filt.matches(e)]

