"""HTTP API: what is pending and why (``GET /v1/queue``).

A tenant sees its own waiting tasks, an operator the demand its pools could serve (waiting
tasks of the tenants and runtime classes those pools take), an admin everything. The answer
names runtime classes and reason codes only: never a pool, tenant or task.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request, Response
from pydantic import Field

from app.api.bodies import StrictRoute
from app.api.common import CamelModel, problems
from app.api.task_schemas import FastJSONResponse
from app.api.tasks import TenantHeader
from app.auth import ADMIN, OPERATOR, TENANT, Principal, require_roles
from app.services.queue import queue_get

router = APIRouter(prefix="/v1", tags=["queue"], route_class=StrictRoute)

QueueReaderDep = require_roles(TENANT, OPERATOR, ADMIN)


class QueueItem(CamelModel):
    """Waiting tasks of one runtime class pending for one reason code."""

    runtime_class: str
    code: str = Field(
        description="The pending reason's code (closest miss), `unexamined` before the first "
        "pass, or `reservation_conflict` after lost races."
    )
    pending: int = Field(ge=0, description="Waiting tasks (ADMITTED or CLAIMED).")
    parked: int = Field(ge=0, description="Of those, parked until a wakeup could help them.")


class QueueSummary(CamelModel):
    """What is pending for the caller, by reason code and runtime class."""

    pending: int = Field(ge=0)
    parked: int = Field(ge=0)
    by_reason: dict[str, int]
    by_runtime_class: dict[str, int]
    items: list[QueueItem]
    oldest_pending_at: datetime | None = Field(
        description="Admission time of the oldest waiting task in scope."
    )
    oldest_pending_seconds: float | None = Field(description="Its age now, in seconds.")


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
