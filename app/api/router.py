"""Every v1 route, flat, in the order requests are matched and the OpenAPI document lists them."""

from __future__ import annotations

from starlette.routing import BaseRoute

from app.api import (
    batches,
    cohorts,
    keys,
    leases,
    placements,
    pools,
    queue,
    replays,
    runtimes,
    tasks,
    tenants,
    watch,
)


def api_routes() -> list[BaseRoute]:
    """Return every v1 route (each module's router carries the /v1 prefix).

    The routes go straight into the application's route list, ahead of the documentation
    routes, rather than through ``include_router``: FastAPI keeps an included router as a
    nested node that every request descends through, and Starlette (and the HTTP metrics,
    which look the route up again for its label) try routes in order. So the hot createTask
    and getTask (:class:`app.api.direct_routes.DirectRoute`) come first.
    """
    routers = (tasks.direct_router, tasks.router, batches.router, pools.router, placements.router,
               queue.router, runtimes.router, leases.router, keys.router, tenants.router,
               cohorts.router, watch.router, replays.router)
    return [route for router in routers for route in router.routes]
