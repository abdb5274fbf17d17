"""``berth reconcile``: a reconciler process alone, for scaling reconcilers apart from the API.

The database is resolved like ``berth serve`` does (``BERTH_DATABASE_URL`` checked to be
reachable and at schema head, or the embedded PostgreSQL). SIGTERM or SIGINT stops the loop
after the current pass; a second signal abandons the pass (its transaction rolls back and
its claims expire). Metrics are served on ``BERTH_RECONCILER_METRICS_PORT`` when it is set.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings, get_settings
from app.db import make_engine
from app.errors import ConfigurationError
from app.logs import logging_configure
from app.reconciler.config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from app.shards import shard_parse, shard_slots_static

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


def _database(settings: Settings) -> tuple[str, object | None]:
    try:
        from app.serve import database_resolve
    except ImportError:  # pragma: no cover - serve ships with Berth
        if not settings.database_url:
            raise ConfigurationError("no database: set BERTH_DATABASE_URL") from None
        return settings.database_url, None
    return database_resolve(settings, migrate=False)


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
    engine = make_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        connect_timeout_seconds=settings.db_connect_timeout_seconds,
        application_name="berth-reconcile",
    )
    reconciler = Reconciler(engine, ReconcilerConfig.from_settings(settings), slots=slots)
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
            await runner
        except asyncio.CancelledError:
            if task is not None and task.cancelling():
                raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await engine.dispose()


def run_reconciler(shard: str | None = None) -> int:
    """Run a reconciler until SIGTERM/SIGINT; ``shard`` INDEX/COUNT (else dynamic); return 0."""
    settings = get_settings()
    logging_configure(settings.log_level)
    slots = slots_from_shard(shard if shard is not None else settings.shard)
    url, server = _database(settings)
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


def reconciler_start(engine: AsyncEngine, settings: Settings) -> ReconcilerTask:
    """Start an in-process reconciler on ``engine`` (static shard if settings.shard is set)."""
    slots = slots_from_shard(settings.shard)
    reconciler = Reconciler(engine, ReconcilerConfig.from_settings(settings), slots=slots)
    return ReconcilerTask(reconciler)
