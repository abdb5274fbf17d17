"""Every v1 router, in the order they appear in the OpenAPI document."""

from __future__ import annotations

from fastapi import APIRouter

from app.api import leases, placements, pools, runtimes, tasks


def api_router() -> APIRouter:
    """Return one router holding every v1 route."""
    # Each module's router makes StrictRoutes (415 / 400 before the schema's 422);
    # include_router keeps the class of every route it copies.
    router = APIRouter(prefix="/v1")
    for module in (pools, tasks, placements, runtimes, leases):
        router.include_router(module.router)
    return router
