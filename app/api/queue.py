"""HTTP API: what is pending and why (``GET /v1/queue``).

A tenant sees its own waiting tasks, an operator the demand its pools could serve (waiting
tasks of the tenants and runtime classes those pools take), an admin everything. The answer
names runtime classes and reason codes only: never a pool, tenant or task.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.bodies import StrictRoute
from app.api.common import problems
from app.api.task_schemas import FastJSONResponse
from app.api.tasks import TenantHeader
from app.auth import ADMIN, OPERATOR, TENANT, Principal, require_roles
from app.services.queue import QueueSummary, queue_get

router = APIRouter(prefix="/v1", tags=["queue"], route_class=StrictRoute)

QueueReaderDep = require_roles(TENANT, OPERATOR, ADMIN)


@router.get(
    "/queue",
    operation_id="getQueue",
    summary="What is pending and why",
    response_model=QueueSummary,
    responses=problems(400, 401, 403, 422),
)
async def get_queue(
    request: Request,
    principal: Principal = QueueReaderDep,
    tenant: TenantHeader = None,
) -> Response:
    """Count waiting tasks by runtime class and pending reason code, with the oldest's age.

    A tenant key sees its own tasks (`X-Berth-Tenant` narrows a multi-tenant key); an
    operator the tasks its pools could serve; an admin every task. Names no pool or tenant.
    """
    summary = await queue_get(
        request.app.state.db, principal=principal,
        tenant=tenant if principal.role == TENANT else None,
    )
    return FastJSONResponse(summary)
