"""HTTP API: runtimes — heartbeats and the leases granted to a runtime instance.

Only runtime keys reach these routes, and only for the instances their key names: a runtime
heartbeating or listing another instance is refused with 403 (the instance id is in the
path the caller chose, so nothing is revealed by saying no).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import Field

from app.api.bodies import StrictRoute
from app.api.common import CamelModel, CursorQuery, LimitQuery, cursor_decode, cursor_encode
from app.api.common import problems as problem_responses
from app.api.watch_cursors import list_watch_cursor
from app.auth import RuntimeDep
from app.errors import BadRequest
from app.services import runtimes as service

router = APIRouter(prefix="/v1", tags=["runtimes"], route_class=StrictRoute)

InstanceIdPath = Annotated[
    str,
    Path(
        alias="instanceId",
        description="The runtime instance id (a pool's runtimeInstanceId); an instance the "
        "key does not act for answers 403, whatever its id.",
        examples=["rt-eu-1"],
    ),
]


class RevokingLease(CamelModel):
    """A lease the runtime should stop by ``revokeBy`` (its task was preempted)."""

    lease_id: str
    task_id: str
    epoch: int
    revoke_by: datetime


class Heartbeat(CamelModel):
    """What a heartbeat did."""

    model_config = {
        "json_schema_extra": {
            "examples": [
                {
                    "instanceId": "rt-eu-1",
                    "lastHeartbeatAt": "2026-01-01T12:00:00Z",
                    "renewedLeases": 3,
                    "leasesExpireAt": "2026-01-01T12:01:00Z",
                    "heartbeatFreshnessSeconds": 15.0,
                    "revoking": [
                        {"leaseId": "0b6f3c5e-3d4a-4c1e-9a57-2f1f4f0c9d11",
                         "taskId": "5d1c2b7a-8e9f-4a3b-b6c5-1d2e3f4a5b6c", "epoch": 1,
                         "revokeBy": "2026-01-01T12:00:30Z"}
                    ],
                }
            ]
        }
    }

    instance_id: str
    last_heartbeat_at: datetime
    renewed_leases: int = Field(description="Live leases of the instance whose expiry moved.")
    leases_expire_at: datetime = Field(description="The new expiry of the renewed leases.")
    heartbeat_freshness_seconds: float = Field(
        description="Heartbeat at least this often, or the instance's pools turn unhealthy."
    )
    revoking: list[RevokingLease] = Field(
        default_factory=list,
        description="Leases of the instance asked to stop (preempted): stop each task by its "
        "`revokeBy` and complete the lease; a completion until then is honoured.",
    )


class LeaseRequests(CamelModel):
    """What each member of the leased task needs."""

    cpu_millis: int
    memory_mib: int = Field(alias="memoryMiB")
    llm_slots: int


class RuntimeLease(CamelModel):
    """A live lease granted to a runtime instance: run this task (``members`` copies here)."""

    id: str = Field(description="The lease id; complete it with completeLease.")
    task_id: str
    pool_id: str
    runtime_instance_id: str
    epoch: int = Field(description="Fencing epoch: send it back when completing the lease.")
    expires_at: datetime
    granted_at: datetime
    members: int = Field(description="Members of the task placed on this lease's pool.")
    tenant_id: str
    requests: LeaseRequests
    labels: dict[str, str]
    state: Literal["ACTIVE", "REVOKING"] = Field(
        description="`REVOKING`: stop the work by `revokeBy` (the task was preempted); a "
        "completion until then is honoured, after it the lease is revoked (409)."
    )
    revoke_by: datetime | None = Field(description="Set while `REVOKING`.")


class RuntimeLeasePage(CamelModel):
    """One page of a runtime's leases, oldest grant first."""

    items: list[RuntimeLease]
    next_cursor: str | None = None
    watch_cursor: str | None = Field(
        default=None, description="Watch from here (`GET /v1/watch?after=`) to follow every "
        "change after this list.")


@router.post(
    "/runtimes/{instanceId}/heartbeat",
    operation_id="heartbeatRuntime",
    summary="Report a runtime instance alive and renew its leases",
    response_model=Heartbeat,
    responses=problem_responses(401, 403),
)
async def heartbeat_runtime(
    instance_id: InstanceIdPath, principal: RuntimeDep, request: Request
) -> Heartbeat:
    """Record that the instance is alive (its pools count as healthy while heartbeats are
    fresher than the freshness window) and push the expiry of its live leases forward. The
    answer lists the instance's leases asked to stop (`revoking`). No body. For runtime keys
    acting for the instance."""
    settings = request.app.state.settings
    now = datetime.now(UTC)
    result = await service.runtime_heartbeat(
        request.app.state.db,
        principal=principal,
        instance_id=instance_id,
        now=now,
        lease_ttl_seconds=settings.lease_ttl_seconds,
        freshness_seconds=settings.heartbeat_freshness_seconds,
    )
    return Heartbeat(
        instance_id=instance_id,
        last_heartbeat_at=now,
        renewed_leases=result.renewed_leases,
        leases_expire_at=now + timedelta(seconds=settings.lease_ttl_seconds),
        heartbeat_freshness_seconds=settings.heartbeat_freshness_seconds,
        revoking=[RevokingLease.model_validate(r) for r in result.revoking],
    )


@router.get(
    "/runtimes/{instanceId}/leases",
    operation_id="listRuntimeLeases",
    summary="List the live leases granted to a runtime instance",
    response_model=RuntimeLeasePage,
    responses=problem_responses(400, 401, 403, 422),
)
async def list_runtime_leases(
    instance_id: InstanceIdPath,
    principal: RuntimeDep,
    request: Request,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
) -> RuntimeLeasePage:
    """List the instance's live leases, oldest grant first: what the runtime should be
    running now. A `REVOKING` lease asks the runtime to stop its task by `revokeBy`. For
    runtime keys acting for the instance."""
    watch_cursor = await list_watch_cursor(request)
    leases = await service.runtime_leases(
        request.app.state.db, principal=principal, instance_id=instance_id
    )
    tokens = await request.app.state.tokens.get()
    scope = f"leases:{instance_id}"
    start = 0
    if cursor is not None:
        position = _position_decode(cursor_decode(tokens, cursor, scope=scope))
        # Leases are ordered by (grantedAt, id); resume after the last one seen.
        start = next(
            (i for i, lease in enumerate(leases) if _position(lease) > position), len(leases)
        )
    page = leases[start : start + limit]
    more = start + limit < len(leases)
    next_cursor = (
        cursor_encode(tokens, [page[-1]["grantedAt"], page[-1]["id"]], scope=scope)
        if more and page else None
    )
    return RuntimeLeasePage(
        items=[RuntimeLease.model_validate(lease) for lease in page], next_cursor=next_cursor,
        watch_cursor=watch_cursor,
    )


def _position(lease: dict) -> tuple[datetime, str]:
    return (datetime.fromisoformat(lease["grantedAt"]), lease["id"])


def _position_decode(after: Any) -> tuple[datetime, str]:
    invalid = BadRequest("the cursor is not valid; pass back the nextCursor of a list")
    if not (isinstance(after, list) and len(after) == 2 and all(isinstance(p, str) for p in after)):
        raise invalid
    try:
        granted = datetime.fromisoformat(after[0])
    except ValueError:
        raise invalid from None
    if granted.tzinfo is None:
        raise invalid
    return (granted, after[1])
