"""HTTP API: leases — a runtime reports the outcome of a leased task.

Completion names the lease's fencing epoch: a lease that expired or was revoked and whose
task was granted again has moved on, so a stale runtime's report is 409 and changes
nothing. A lease of another runtime instance answers 404, like one that does not exist.
With an ``Idempotency-Key``, a runtime that lost the answer may send the same completion
again and gets the first answer instead of a 409.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, ConfigDict, Field

from app.api.bodies import StrictRoute
from app.api.common import CamelModel, RequestModel, problems
from app.auth import RuntimeDep
from app.ledger.leases import LeaseNotFound
from app.services import leases as service

router = APIRouter(prefix="/v1", tags=["leases"], route_class=StrictRoute)

def _lease_id_known(value: object) -> uuid.UUID:
    """Return ``value`` as a lease UUID, or raise 404: no lease has a malformed id."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise LeaseNotFound() from None


LeaseIdPath = Annotated[
    uuid.UUID,
    Path(alias="leaseId", description="The lease id (a UUID); any other value answers 404."),
    BeforeValidator(_lease_id_known),
]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="Repeat a completion safely: the same key and body replay the first "
        "answer; the same key with a different body is 409.",
    ),
]


class LeaseCompletion(RequestModel):
    """The outcome of a leased task, with the lease's fencing epoch."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"outcome": "succeeded", "epoch": 1}]}
    )

    outcome: Literal["succeeded", "failed", "released"] = Field(
        description="`succeeded` or `failed`: the task finished. `released`: the runtime "
        "stopped the work unfinished and the task is queued again; on a `REVOKING` lease "
        "without using an attempt, on an `ACTIVE` lease with `attempts + 1` (past "
        "`maxAttempts` the task fails with `lease_released`)."
    )
    epoch: int = Field(ge=1, le=2**62, description="The epoch the lease was granted with.")
    message: str | None = Field(
        default=None, max_length=1000, description="Kept in the task's event log."
    )


class LeaseCompleted(CamelModel):
    """The task's state after its lease completed; its capacity is released (or handed to
    the task that preempted it)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "taskId": "0b6e4c52-8a1e-4c55-9d9e-3f7d0a1c2b3d",
                    "leaseId": "5a7f9e0c-1d2b-4e3f-8a9b-0c1d2e3f4a5b",
                    "state": "SUCCEEDED",
                    "outcome": "succeeded",
                    "epoch": 1,
                    "finishedAt": "2026-01-01T12:00:00Z",
                }
            ]
        }
    )

    task_id: str
    lease_id: str
    state: Literal["SUCCEEDED", "FAILED", "ADMITTED"]
    outcome: Literal["succeeded", "failed", "released"]
    epoch: int
    finished_at: datetime


@router.post(
    "/leases/{leaseId}/complete",
    operation_id="completeLease",
    summary="Complete a lease with its task's outcome",
    response_model=LeaseCompleted,
    responses=problems(401, 403, 404, 409, 413, 422),
)
async def complete_lease(
    lease_id: LeaseIdPath,
    body: LeaseCompletion,
    principal: RuntimeDep,
    request: Request,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Finish the lease's task as SUCCEEDED or FAILED, or give it back unfinished
    (`released`: queued again as ADMITTED), and release its capacity (every pool of a gang).
    404 for an unknown lease or one of another instance; 409 when the epoch is stale
    or the lease already ended. For runtime keys."""
    answer = await service.lease_complete(
        request.app.state.db,
        principal=principal,
        lease_id=lease_id,
        outcome=body.outcome,
        epoch=body.epoch,
        message=body.message,
        idempotency_key=idempotency_key,
    )
    if answer.replayed:
        return JSONResponse(
            answer.body, status_code=answer.status, headers={"Idempotent-Replayed": "true"}
        )
    completed = LeaseCompleted.model_validate(answer.body)
    return JSONResponse(completed.model_dump(mode="json", by_alias=True))
