"""``berth reconcile``: a reconciler process alone, for scaling reconcilers apart from the API.

The database is resolved like ``berth serve`` does (:func:`app.startup.database_resolve`:
``BERTH_DATABASE_URL`` checked to be reachable and at schema head, or the embedded
PostgreSQL). SIGTERM or SIGINT stops the loop
after the current pass; a second signal abandons the pass (its transaction rolls back and
its claims expire). Metrics are served on ``BERTH_RECONCILER_METRICS_PORT`` when it is set.

:func:`reconciler_background` is the same reconciler as a background service of the API app,
for ``berth serve`` to compose.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from app.config import Settings, get_settings
from app.db import Database
from app.errors import ConfigurationError
from app.gc_tuning import gc_paused, gc_tuned
from app.logs import logging_configure
from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from app.shards import shard_parse, shard_slots_static
from app.startup import database_resolve, settings_for

log = logging.getLogger("berth.reconciler")


def slots_from_shard(shard: str | None) -> frozenset[int] | None:
    """Return the static slots of ``INDEX/COUNT``, None for dynamic ownership."""
    if shard is None or shard == "":
        return None
    try:
        index, count = shard_parse(shard)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return shard_slots_static(index, count)


def _metrics_serve(port: int | None) -> None:
    if port is None:
        return
    from prometheus_client import start_http_server

    try:
        start_http_server(port)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve reconciler metrics on port {port} ({exc.strerror}); "
            "choose another BERTH_RECONCILER_METRICS_PORT"
        ) from None


async def _run(settings: Settings, url: str, slots: frozenset[int] | None) -> None:
    db = Database(
        url,
        max_size=settings.db_pool_size,
        connect_timeout_seconds=settings.db_connect_timeout_seconds,
        application_name="berth-reconcile",
    )
    # A process of its own serves no requests: its collector pauses while a pass runs.
    reconciler = Reconciler(
        db, ReconcilerConfig.from_settings(settings), slots=slots, pass_guard=gc_paused
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("stopping after the current pass", extra={"owner": reconciler.owner_id})
            stop.set()
        elif runner is not None:
            log.warning("abandoning the current pass", extra={"owner": reconciler.owner_id})
            runner.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    runner: asyncio.Task | None = None
    try:
        runner = asyncio.ensure_future(reconciler.run(stop))
        try:
            with gc_tuned():
                await runner
        except asyncio.CancelledError:
            if task is not None and task.cancelling():
                raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await db.close()


def run_reconciler(shard: str | None = None, data_dir: str | Path | None = None) -> int:
    """Run a reconciler until SIGTERM/SIGINT; ``shard`` INDEX/COUNT (else dynamic); return 0.

    The embedded database in ``data_dir`` must exist (``berth serve`` or ``berth migrate``
    makes it): a reconciler on a new empty database would schedule nothing, silently.
    """
    settings = settings_for(get_settings(), data_dir)
    logging_configure(settings.log_level)
    slots = slots_from_shard(shard if shard is not None else settings.shard)
    url, server = database_resolve(settings, migrate=False, create=False)
    try:
        _metrics_serve(settings.reconciler_metrics_port)
        asyncio.run(_run(settings, url, slots))
    finally:
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
    return 0


class ReconcilerTask:
    """A reconciler running as an asyncio task inside another process (``berth serve``)."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self._stop = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            await self.reconciler.run(self._stop)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("in-process reconciler stopped on an error",
                          extra={"owner": self.reconciler.owner_id})

    async def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop after the current pass; abandon it after ``timeout_seconds``."""
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=timeout_seconds)
        except TimeoutError:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass


#: A background service of the app: started with its database, it returns its stop function.
Background = Callable[[Database], Callable[[], Awaitable[None]]]


def reconciler_background(settings: Settings) -> Background:
    """Return the in-process reconciler as a background service of the API app.

    ``create_app(settings, background=[...])`` calls it with the app's database when the app
    starts (static shard if ``settings.shard`` is set, else dynamic ownership) and awaits the
    returned function when it stops: the current pass finishes, or is abandoned after 10 s.
    """

    def start(db: Database) -> Callable[[], Awaitable[None]]:
        slots = slots_from_shard(settings.shard)
        # The API's process: the collector is never paused for a pass.
        reconciler = Reconciler(db, ReconcilerConfig.from_settings(settings), slots=slots)
        return ReconcilerTask(reconciler).stop

    return start
