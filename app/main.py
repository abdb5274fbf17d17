"""The FastAPI application factory: the database, routers and error handlers — nothing else.

``create_app`` builds the API and starts nothing besides its database pool; the composition
root that adds an in-process reconciler is ``berth serve`` (:mod:`app.serve`), which passes
it in as a background service.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import REGISTRY, CollectorRegistry

from app import __version__
from app.api import batches
from app.api.front_door import FrontDoor
from app.api.http_metrics import http_metrics_install
from app.api.limits import BodySizeLimit
from app.api.openapi import openapi_install
from app.api.problems import problem_response, problems_install
from app.api.router import api_routes
from app.api.shedding import InFlightLimit
from app.api.timeouts import BodyReadTimeout
from app.auth import KeyCache
from app.config import Settings, get_settings
from app.console import console_routes
from app.db import Database
from app.errors import ConfigurationError
from app.gc_tuning import gc_frozen
from app.schema import schema_current, schema_head
from app.services.offload import Offload, loop_lag_watch
from app.services.queue import QueueCache
from app.services.tokens import TokenSource

log = logging.getLogger("berth")


#: A background service the app runs while it serves: called with the app's database at
#: start-up, it returns the coroutine function that stops it.
Background = Callable[[Database], Callable[[], Awaitable[None]]]


async def readiness(db: Database) -> str | None:
    """Return None when the database answers and its schema is at head, else why not."""
    try:
        async with db.connection() as conn:
            current = await schema_current(conn)
    except Exception as exc:
        if type(exc).__name__ == "TargetServerAttributeNotMatched":
            return ("no host of the database URL is what its target_session_attrs asks for "
                    "(read-write: a primary; none during a failover)")
        return f"database unreachable: {type(exc).__name__}"
    head = schema_head()
    if current != head:
        return f"database schema is at {current or 'nothing'}, not {head}: run `berth migrate`"
    return None


class _DefaultMetrics:
    """Berth's own metrics (the default registry), collected into an app's HTTP registry."""

    def collect(self):  # type: ignore[no-untyped-def]
        """Yield every metric of the default registry."""
        return REGISTRY.collect()


def _state_open(app: FastAPI, settings: Settings) -> None:
    """Give the app, whose database is set, its caches and its started preview workers."""
    app.state.settings = settings
    app.state.key_cache = KeyCache()
    app.state.queue_cache = QueueCache(settings.queue_snapshot_seconds)
    app.state.tokens = TokenSource(app.state.db)
    app.state.offload = Offload(
        workers=settings.preview_workers,
        max_concurrent=settings.preview_max_concurrent,
        timeout_seconds=settings.preview_timeout_seconds,
        database_url=app.state.db.url,
    )
    app.state.offload.start()


def _lifespan(
    settings: Settings, db: Database | None, background: Sequence[Background]
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Return the app's lifespan: its database (``db``, else one of its own for the
    settings), caches and preview workers, and the ``background`` services, started in order
    and stopped in reverse."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_db = db is None
        app.state.db = db or Database(
            settings.database_url or "",
            max_size=settings.db_pool_size,
            connect_timeout_seconds=settings.db_connect_timeout_seconds,
            pool_wait_seconds=settings.db_pool_wait_seconds,
            application_name="berth-api",
        )
        _state_open(app, settings)
        lag = asyncio.ensure_future(loop_lag_watch())
        stops = [start(app.state.db) for start in background]
        try:
            with gc_frozen():
                yield
        finally:
            hub = getattr(app.state, "watch_hub", None)
            if hub is not None:
                await hub.stop()
            for stop in reversed(stops):
                await stop()
            lag.cancel()
            app.state.offload.close()
            if own_db:
                await app.state.db.close()

    return lifespan


def _health_install(app: FastAPI) -> None:
    """Add the liveness and readiness routes."""

    @app.get("/healthz", tags=["health"], operation_id="getHealth", summary="Liveness")
    async def healthz() -> dict[str, str]:
        """Answer 200 while the process is alive."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        operation_id="getReadiness",
        summary="Readiness: database reachable and schema at head",
        responses={503: {"description": "Not ready", "content": {"application/problem+json": {}}}},
    )
    async def readyz() -> JSONResponse:
        """Answer 200 when the database is reachable and its schema at head, else 503."""
        why = await readiness(app.state.db)
        if why is not None:
            return problem_response(
                503,
                detail=why,
                type_uri="https://berth.dev/problems/unavailable",
                headers={"Retry-After": "1"},
            )
        return JSONResponse({"status": "ready"})


def _front_door_install(app: FastAPI, settings: Settings) -> None:
    """Add the front door, load shedding and the body deadline (docs/operations.md#limits).

    Each added middleware wraps the ones before it, so a request meets them bottom-up: the
    front door (headers, key, the key's rate limit), the in-flight bound, the body deadline,
    then the body size limit that ``create_app`` added first."""
    app.add_middleware(BodyReadTimeout, timeout_seconds=settings.request_body_timeout_seconds)
    app.add_middleware(InFlightLimit, max_in_flight=settings.max_in_flight_requests)
    app.add_middleware(
        FrontDoor,
        max_unauthenticated=settings.max_unauthenticated_requests,
        invalid_keys_per_second=settings.invalid_keys_per_second,
        invalid_key_burst=settings.invalid_key_burst_requests,
        rate_per_second=settings.rate_limit_requests_per_second,
        rate_burst=settings.rate_limit_burst_requests,
    )


def create_app(
    settings: Settings | None = None,
    *,
    db: Database | None = None,
    background: Sequence[Background] = (),
) -> FastAPI:
    """Build the Berth ASGI application; ``db`` defaults to one for settings.database_url,
    and each of ``background`` is started with it when the app starts and stopped after."""
    settings = settings or get_settings()
    if db is None and settings.database_url is None:
        raise ConfigurationError(
            "no database: set BERTH_DATABASE_URL, or run `berth serve` for the embedded one"
        )

    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from files the package ships
    # (served under /static-offline-docs), never from a CDN, so they work offline.
    app = FastAPIOffline(
        title="Berth",
        version=__version__,
        summary="Multi-tenant placement scheduler with a durable capacity ledger.",
        lifespan=_lifespan(settings, db, background),
        # Berth's observability is Prometheus; FastAPI's native OpenTelemetry would
        # otherwise look up the global OTel providers on every request only to find none.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # No "validate this document" badge: it would send the document's URL to swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    problems_install(app)
    app.add_middleware(
        BodySizeLimit, max_body_bytes=settings.max_body_bytes,
        path_limits={batches.PATH: settings.max_batch_body_bytes},
    )
    app.router.routes[0:0] = api_routes()
    # The web console (static files; it calls the API above like any other client).
    app.router.routes.extend(console_routes())
    openapi_install(app)
    _health_install(app)
    _front_door_install(app, settings)

    # HTTP metrics live in a registry of this app (a second app in one process, as in tests,
    # would otherwise record nothing); /metrics serves it together with Berth's own metrics.
    http_registry = CollectorRegistry(auto_describe=False)
    http_registry.register(_DefaultMetrics())
    # Added last, the instrumentation sees every answer, the refusals above included.
    http_metrics_install(app, registry=http_registry)
    return app
