"""CPU work of a request, off the API's event loop: a process pool with a bound.

A preview decides hundreds of tasks or ranks thousands of pools, and builds a document of
them; done on the event loop, that stops every other request of the process (a heartbeat, a
task read) for as long. The database reads of a request stay on the loop (asyncpg); the pure
part — deciding and building the answer — runs in a worker process, so the loop only waits.

Processes, not threads: the decision is Python that holds the GIL, and a thread holding it
delays the loop's every step. Workers run at a lower CPU priority than the API process
(:data:`WORKER_NICENESS`), so that on a busy machine the loop is scheduled first.

At most ``preview_workers`` computations run at once and ``preview_max_concurrent`` requests
may be running or waiting for a worker; past that, the request is refused at once with 429
and ``Retry-After``. A computation that has not finished after ``preview_timeout_seconds``
is answered 503 with ``Retry-After`` (its worker finishes it and throws it away; its slot
stays taken until then, so abandoned work cannot pile up).

A worker reads the database itself (:func:`worker_read`), on its own event loop and
connection, and keeps the pools' snapshot between computations
(:class:`~app.ledger.snapshot.SnapshotCache`, refreshed from the rows written since its
previous read, as a reconciler refreshes its own between passes): a request sends only what
it asks, never the thousands of pool rows a decision reads. A read starts after the request
did, so it sees every change committed before the request began.

A worker exits when the process that started it is gone (killed, or stopped without
closing its workers): it checks its parent every :data:`ORPHAN_CHECK_SECONDS`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, TypeVar

import asyncpg
from asyncpg.exceptions import InternalClientError

from app.db import Connection, Database
from app.errors import BerthError
from app.ledger.snapshot import SnapshotCache
from app.metrics import LOOP_LAG, PREVIEW_ROWS_READ, REQUESTS_SHED

__all__ = [
    "ORPHAN_CHECK_SECONDS",
    "WORKER_NICENESS",
    "ComputeBusy",
    "ComputeTimeout",
    "ComputeUnavailable",
    "Offload",
    "WorkerState",
    "loop_lag_watch",
    "worker_read",
]

T = TypeVar("T")

#: Niceness added to each worker process (Linux: 0 normal .. 19 lowest priority).
WORKER_NICENESS = 10
#: How often a worker process checks that the process that started it is still there.
ORPHAN_CHECK_SECONDS = 0.5
#: How often the API process's event loop lag is sampled.
LOOP_LAG_INTERVAL_SECONDS = 0.025

#: Modules each worker imports when it starts, so that its first computation does not.
_PRELOAD = ("app.services.previews", "app.services.eta")


class ComputeBusy(BerthError):
    """As many previews as this process allows are running or waiting; retry shortly."""

    status = 429
    title = "Too Many Requests"
    type_slug = "compute-busy"


class ComputeTimeout(BerthError):
    """The preview took longer than this process allows; retry later."""

    status = 503
    title = "Service Unavailable"
    type_slug = "compute-timeout"


class ComputeUnavailable(BerthError):
    """A preview's worker could not read the database; retry shortly."""

    status = 503
    title = "Service Unavailable"
    type_slug = "unavailable"


#: A database fault in a worker's read: answered 503 (and sent back as one picklable error).
_DATABASE_FAULTS = (
    asyncpg.PostgresError, asyncpg.InterfaceError, InternalClientError, OSError, TimeoutError,
)


class WorkerState:
    """What one worker keeps between computations: its event loop, its connection to the
    database (opened on first use) and the pools' snapshot of each strategy."""

    def __init__(self, database_url: str | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.db = (Database(database_url, max_size=1, application_name="berth-preview")
                   if database_url else None)
        self.snapshots: dict[str, SnapshotCache] = {}

    def snapshot_cache(self, strategy: str) -> SnapshotCache:
        """Return the snapshot kept for ``strategy`` (its static part is built per strategy)."""
        cache = self.snapshots.get(strategy)
        if cache is None:
            cache = self.snapshots[strategy] = SnapshotCache()
        return cache

    def rows_read(self) -> int:
        """Return how many rows the refreshes of this worker's snapshots have read."""
        return sum(cache.rows_read for cache in self.snapshots.values())

    def close(self) -> None:
        """Close the connection and the loop."""
        if self.db is not None:
            self.loop.run_until_complete(self.db.close())
        self.loop.close()


_LOCAL = threading.local()


def worker_read(read: Callable[[Connection, WorkerState], Awaitable[T]]) -> T:
    """Return ``await read(conn, state)`` on this worker's loop and connection; a database
    fault is :class:`ComputeUnavailable` (503)."""
    state: WorkerState = _LOCAL.state
    if state.db is None:
        raise RuntimeError("this worker has no database (Offload without database_url)")
    db = state.db

    async def run() -> T:
        async with db.connection() as conn:
            return await read(conn, state)

    try:
        return state.loop.run_until_complete(run())
    except _DATABASE_FAULTS as exc:
        raise ComputeUnavailable(
            f"the preview could not read the database ({type(exc).__name__}); retry shortly",
            extra={"headers": {"Retry-After": "1"}},
        ) from None


def _orphan_watch(parent: int) -> None:
    """Exit this process once ``parent`` is no longer its parent (it died: the orphan was
    re-parented)."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_SECONDS)
    os._exit(0)


def _worker_start(parent: int, database_url: str | None) -> None:
    """Exit with ``parent``, lower the worker's CPU priority and import what computations
    need."""
    threading.Thread(target=_orphan_watch, args=(parent,), daemon=True,
                     name="berth-orphan-watch").start()
    if os.getppid() != parent:  # the parent died before the watch started
        os._exit(0)
    try:
        os.nice(WORKER_NICENESS)
    except OSError:  # pragma: no cover - a platform without nice: run at normal priority
        pass
    for name in _PRELOAD:
        __import__(name)
    _LOCAL.state = WorkerState(database_url)


def _thread_start(database_url: str | None) -> None:
    _LOCAL.state = WorkerState(database_url)


def _thread_stop() -> None:
    _LOCAL.state.close()


def _warm() -> int:
    return os.getpid()


def _counted(fn: Callable[..., T], /, *args: Any) -> tuple[T, int]:
    """Return ``fn(*args)`` and the rows its snapshot refreshes read, in a worker."""
    state: WorkerState = _LOCAL.state
    before = state.rows_read()
    value = fn(*args)
    return value, state.rows_read() - before


class Offload:
    """Run pure functions of requests in worker processes, at most ``max_concurrent`` at
    once (running or waiting), each answered within ``timeout_seconds``.

    ``workers=0`` runs them in one thread of the API process instead (a small install or
    a test, where starting processes costs more than it saves). ``database_url`` is what
    :func:`worker_read` reads in a worker.
    """

    def __init__(self, *, workers: int, max_concurrent: int, timeout_seconds: float,
                 database_url: str | None = None) -> None:
        self.database_url = database_url
        self.workers = workers
        self.max_concurrent = max_concurrent
        self.timeout_seconds = timeout_seconds
        self.in_use = 0
        self._executor: Executor | None = None

    def start(self) -> None:
        """Start the workers (each imports the modules computations need)."""
        if self._executor is not None:
            return
        if self.workers == 0:
            self._executor = ThreadPoolExecutor(
                1, thread_name_prefix="berth-compute", initializer=_thread_start,
                initargs=(self.database_url,))
            return
        context = multiprocessing.get_context("spawn")
        self._executor = ProcessPoolExecutor(
            self.workers, mp_context=context, initializer=_worker_start,
            initargs=(os.getpid(), self.database_url),
        )
        for _ in range(self.workers):
            self._executor.submit(_warm)

    def close(self) -> None:
        """Stop the workers and wait, at most ``timeout_seconds``, until they are gone,
        dropping computations that have not started (the thread of ``workers=0`` runs them,
        then closes its connection). The pool's queues are released here: under uvicorn the
        process then ends by the signal that stopped it, raised again, which runs no exit
        handler, and queues still held would be reported as leaked semaphores."""
        executor = self._executor
        if executor is None:
            return
        self._executor = None
        if self.workers == 0:
            executor.submit(_thread_stop)
        stopping = threading.Thread(
            target=executor.shutdown, kwargs={"wait": True, "cancel_futures": self.workers > 0},
            name="berth-compute-stop", daemon=True,
        )
        stopping.start()
        stopping.join(self.timeout_seconds)

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        """Return ``fn(*args)`` computed by a worker; 429 past the bound, 503 past the
        timeout."""
        if self.in_use >= self.max_concurrent:
            REQUESTS_SHED.labels("compute_bound").inc()
            raise ComputeBusy(
                f"{self.max_concurrent} previews are running or waiting on this process, "
                "its limit (BERTH_PREVIEW_MAX_CONCURRENT); retry in a second",
                extra={"headers": {"Retry-After": "1"}},
            )
        self.start()
        assert self._executor is not None
        self.in_use += 1
        future: Future[tuple[T, int]] = self._executor.submit(_counted, fn, *args)
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda _: self._release(loop))
        try:
            value, rows = await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), self.timeout_seconds
            )
        except TimeoutError:
            future.cancel()
            raise ComputeTimeout(
                f"the preview did not finish within {self.timeout_seconds:g} s "
                "(BERTH_PREVIEW_TIMEOUT_SECONDS); retry later",
                extra={"headers": {"Retry-After": str(max(1, round(self.timeout_seconds)))}},
            ) from None
        PREVIEW_ROWS_READ.observe(rows)
        return value

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        """Free the slot of a finished computation, on the event loop (this is called in
        the executor's thread, and the loop owns the count)."""
        try:
            loop.call_soon_threadsafe(self._free)
        except RuntimeError:  # the loop is closed: nobody counts any more
            pass

    def _free(self) -> None:
        self.in_use -= 1


async def loop_lag_watch(interval: float = LOOP_LAG_INTERVAL_SECONDS) -> None:
    """Sample, until cancelled, how late the event loop wakes a timer due every ``interval``
    (``berth_event_loop_lag_seconds``): whatever holds the loop shows there."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        LOOP_LAG.observe(max(0.0, loop.time() - due))
