"""Every v1 router, in the order they appear in the OpenAPI document."""

from __future__ import annotations

from fastapi import APIRouter

from app.api import leases, placements, pools, queue, runtimes, tasks


def api_router() -> APIRouter:
    """Return one router holding every v1 route."""
    router = APIRouter(prefix="/v1")
    for module in (pools, tasks, placements, queue, runtimes, leases):
        router.include_router(module.router)
    return router
