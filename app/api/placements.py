"""HTTP API: placement preview — a dry run of the core on the live snapshot.

The preview makes the same snapshot read as a reconciler pass (:mod:`app.ledger.snapshot`:
pools, ledgers, heartbeat freshness, and the tenant's placed tasks for affinity), runs
``select(..., explain=True)`` and returns the full explanation. It reserves nothing and
writes nothing; a task submitted right after may still land elsewhere if the ledger moves.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response

from app.api.common import problems
from app.api.task_schemas import FastJSONResponse, PlacementPreview
from app.api.tasks import TenantHeader, tenant_acting
from app.auth import TenantDep
from app.db import ConnDep
from app.ledger.snapshot import placements_read, pools_read
from app.scheduling.framework import select
from app.scheduling.model import Snapshot
from app.scheduling.spec import TaskSpec, compile_spec

router = APIRouter(tags=["placements"])


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
    conn: ConnDep,
    request: Request,
    tenant: TenantHeader = None,
) -> Response:
    """Rank the pools for a spec (the body of `createTask`) now, without reserving anything.

    Every feasible pool appears in `candidates` with its score components; every rejected
    pool the tenant can see appears in `rejected` with its reason codes. Pools that do not
    list the tenant appear nowhere.
    """
    tenant_id = tenant_acting(principal, tenant)
    settings = request.app.state.settings
    # Every pool is read, as in a pass; the core shows the tenant only the pools listing it.
    pools = await pools_read(
        conn, now=datetime.now(UTC), freshness_seconds=settings.heartbeat_freshness_seconds
    )
    placed = await placements_read(conn, tenant_ids=[tenant_id])
    snapshot = Snapshot.build(pools, placed, strategy=str(settings.strategy))
    result = select(compile_spec(spec, tenant_id=tenant_id), snapshot, explain=True)
    return FastJSONResponse(result.to_json())
