"""HTTP API: placement preview — a dry run of the core on the live snapshot.

Reserves nothing and writes nothing (:mod:`app.services.placements`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.bodies import StrictRoute
from app.api.common import problems
from app.api.task_schemas import FastJSONResponse
from app.api.tasks import TenantHeader
from app.auth import TenantDep
from app.scheduling.explain import PlacementPreview, preview_document
from app.scheduling.spec import TaskSpec
from app.services.placements import placement_preview

router = APIRouter(prefix="/v1", tags=["placements"], route_class=StrictRoute)


@router.post(
    "/placements/preview",
    operation_id="previewPlacement",
    summary="Preview where a task would be placed",
    response_model=PlacementPreview,
    responses=problems(400, 401, 403, 413, 422),
)
async def preview_placement(
    spec: TaskSpec,
    principal: TenantDep,
    request: Request,
    tenant: TenantHeader = None,
) -> Response:
    """Rank the pools for a spec (the body of `createTask`) now, without reserving anything.

    Every feasible pool appears in `candidates` with its score components; every rejected
    pool the tenant can see appears in `rejected` with its reason codes. Pools that do not
    list the tenant appear nowhere. For a spec with `preemption: "lowerPriority"` that fits
    nowhere, `preemption` shows the pool it would take and the lower-priority tasks of the
    tenant it would displace, and every candidate pool with the victims it would need.
    """
    settings = request.app.state.settings
    result, preemption = await placement_preview(
        request.app.state.db,
        principal=principal,
        tenant=tenant,
        spec=spec,
        freshness_seconds=settings.heartbeat_freshness_seconds,
        strategy=str(settings.strategy),
    )
    return FastJSONResponse(preview_document(result, preemption))
