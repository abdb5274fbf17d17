"""HTTP API: placement preview — a dry run of the core on the live snapshot.

Reserves nothing and writes nothing (:mod:`app.services.placements`); the answer is one page
of the decision (:mod:`app.services.previews`), computed off the event loop.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.bodies import StrictRoute
from app.api.common import problems
from app.api.preview_schemas import PlacementPreview
from app.api.previews import PreviewCursorQuery, PreviewLimitQuery, preview_answer
from app.api.tasks import TenantHeader
from app.auth import TenantDep
from app.scheduling.spec import TaskSpec
from app.services.placements import placement_ask
from app.services.previews import DEFAULT_LIMIT, placement_preview_page, placement_scope

router = APIRouter(prefix="/v1", tags=["placements"], route_class=StrictRoute)


@router.post(
    "/placements/preview",
    operation_id="previewPlacement",
    summary="Preview where a task would be placed",
    response_model=PlacementPreview,
    responses=problems(400, 401, 403, 413, 422, 429, 503),
)
async def preview_placement(
    spec: TaskSpec,
    principal: TenantDep,
    request: Request,
    tenant: TenantHeader = None,
    limit: PreviewLimitQuery = DEFAULT_LIMIT,
    cursor: PreviewCursorQuery = None,
) -> Response:
    """Rank the pools for a spec (the body of `createTask`) now, without reserving anything.

    The answer holds the placement, the best `limit` candidate pools with their score
    components, the first `limit` rejected pools the tenant can see with their reason codes,
    how many there are of each (`candidateCount`, `rejectedCount`) and the rejections by
    reason code (`rejectedByReason`, naming the first 20 pools of each); `nextCursor` pages
    the rest. Pools that do not list the tenant appear nowhere. For a spec with
    `preemption: "lowerPriority"` that fits nowhere, `preemption` shows the pool it would
    take and the lower-priority tasks of the tenant it would displace, and the best `limit`
    candidate pools with the victims each would need. Too many previews at once on this
    process: 429 with Retry-After.
    """
    settings = request.app.state.settings
    ask = placement_ask(
        principal, tenant=tenant, spec=spec,
        freshness_seconds=settings.heartbeat_freshness_seconds, strategy=str(settings.strategy),
    )
    return await preview_answer(
        request, scope=placement_scope(spec, tenant_id=ask.spec.tenant_id),
        cursor=cursor, limit=limit,
        compute=placement_preview_page, args=(ask,),
    )
