"""Response shapes of tasks, and the row -> JSON mapping.

Each shape is one ``TypedDict``: :func:`task_json` builds it (plain dicts, serialized by
orjson, type-checked against it) and pydantic derives its JSON schema for the OpenAPI
document from the same class. The placement and pending-reason shapes are those of
:mod:`app.scheduling.explain`, which renders them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, NotRequired

import orjson
from fastapi.responses import Response
from pydantic import Field, GetCoreSchemaHandler, with_config
from pydantic_core import CoreSchema
from typing_extensions import TypedDict

from app.ledger.tables import TASK_STATES
from app.ledger.tasks import LeaseView, TaskEventRow, TaskRow
from app.scheduling.explain import DOCUMENT, PendingReason, Placement, placement_document
from app.scheduling.spec import TaskSpec
from app.services.queue import TaskQueue


class TaskState(StrEnum):
    """A task's state: ADMITTED -> LEASED -> SUCCEEDED | FAILED | CANCELLED.

    CLAIMED is never reported: a task being placed stays ADMITTED, row-locked by the
    reconciler pass placing it, until that pass commits. It stays in the enum so that
    clients matching on it keep parsing (a list filtered on it is empty).
    """

    ADMITTED = "ADMITTED"
    CLAIMED = "CLAIMED"
    LEASED = "LEASED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


assert tuple(s for s in TaskState if s != TaskState.CLAIMED) == TASK_STATES


class _SchemaOf:
    """Document a JSON value (a spec as stored, a state as read) by the schema of the model or
    enum it was validated against."""

    def __init__(self, source: type) -> None:
        self.source = source

    def __get_pydantic_core_schema__(
        self, _source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return handler.generate_schema(self.source)


#: A task state as the ledger stores it (one of :class:`TaskState`'s values).
TaskStateValue = Annotated[str, _SchemaOf(TaskState)]


@with_config(DOCUMENT)
class TaskLease(TypedDict):
    """The grant a runtime instance holds while it runs the task."""

    id: uuid.UUID
    poolId: str
    runtimeInstanceId: str
    expiresAt: datetime
    epoch: Annotated[int, Field(ge=1, description="Fencing epoch; lease completion must name it.")]
    state: NotRequired[Annotated[Literal["ACTIVE", "REVOKING"], Field(
        default="ACTIVE", description="`REVOKING`: preempted; the runtime stops by `revokeBy`."
    )]]
    revokeBy: NotRequired[Annotated[
        datetime | None, Field(default=None, description="Set while `REVOKING`.")
    ]]


@with_config(DOCUMENT)
class Task(TypedDict):
    """A task: its spec, state, explanation (placement or pending reason) and lease."""

    id: uuid.UUID
    tenantId: str
    state: TaskStateValue
    spec: Annotated[dict[str, Any], _SchemaOf(TaskSpec)]
    priority: int
    attempts: Annotated[
        int, Field(ge=0, description="Leases of this task that expired or were revoked.")
    ]
    maxAttempts: Annotated[int, Field(ge=1)]
    createdAt: datetime
    updatedAt: datetime
    leasedAt: datetime | None
    finishedAt: datetime | None
    pendingReason: Annotated[
        PendingReason | None, Field(description="Set while ADMITTED and no pool fits now.")
    ]
    placement: Annotated[
        Placement | None, Field(description="Set once placed (LEASED and after).")
    ]
    lease: Annotated[TaskLease | None, Field(
        description="The live lease on `placement.poolId` (a gang's first member's pool)."
    )]
    leases: Annotated[list[TaskLease], Field(
        description="Every live lease, one per pool of a gang, in `placement.members` order."
    )]
    failureReason: Annotated[str | None, Field(description="Set when FAILED or CANCELLED.")]
    queue: NotRequired[Annotated[TaskQueue | None, Field(
        default=None,
        description="Where the task stands while ADMITTED (getTask only; null in lists).",
    )]]


@with_config(DOCUMENT)
class TaskEvent(TypedDict):
    """One transition of a task, with a bounded reason code."""

    id: Annotated[str, Field(
        description="Opaque and stable: the same event always has the same id. It is also "
        "a cursor of the task's event list: the events after it follow."
    )]
    at: datetime
    fromState: TaskStateValue | None
    toState: TaskStateValue
    reason: str
    detail: dict[str, Any] | None


@with_config(DOCUMENT)
class TaskPage(TypedDict):
    """One page of tasks, in admission order."""

    items: list[Task]
    nextCursor: NotRequired[Annotated[str | None, Field(default=None)]]
    #: Watch from here (GET /v1/watch?after=) to follow every change after this list.
    watchCursor: NotRequired[str]


@with_config(DOCUMENT)
class TaskEventPage(TypedDict):
    """One page of a task's transitions, oldest first."""

    items: list[TaskEvent]
    nextCursor: NotRequired[Annotated[str | None, Field(default=None)]]


class FastJSONResponse(Response):
    """A JSON response serialized by orjson from plain values (no response model pass).

    Datetimes are written RFC 3339 with ``Z`` for UTC, as pydantic writes them in the other
    answers (one timestamp format); the ledger's datetimes are all UTC.
    """

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Return ``content`` as JSON bytes."""
        return orjson.dumps(content, option=orjson.OPT_UTC_Z)


# --- row -> JSON -----------------------------------------------------------------------------


def pending_reason_json(raw: dict[str, Any] | None) -> PendingReason | None:
    """Return a stored pending reason in the API shape."""
    if not raw or "code" not in raw:
        return None
    doc: PendingReason = {
        "code": str(raw["code"]),
        "message": str(raw.get("message", "")),
        "rejections": {str(k): int(v) for k, v in (raw.get("rejections") or {}).items()},
    }
    if "victims" in raw:
        doc["victims"] = int(raw["victims"])
        doc["revokeBy"] = raw.get("revokeBy")
    if "nominatedAt" in raw:
        doc["poolIds"] = [str(p) for p in raw.get("poolIds") or []]
        doc["need"] = {str(k): int(v) for k, v in (raw.get("need") or {}).items()}
        doc["held"] = {str(k): int(v) for k, v in (raw.get("held") or {}).items()}
        doc["nominatedAt"] = raw.get("nominatedAt")
    return doc


def _lease_json(lease: LeaseView) -> TaskLease:
    return {
        "id": lease.id,
        "poolId": lease.pool_id,
        "runtimeInstanceId": lease.runtime_instance_id,
        "expiresAt": lease.expires_at,
        "epoch": lease.epoch,
        "state": lease.state,
        "revokeBy": lease.revoke_by,
    }


def _leases_in_member_order(
    leases: tuple[LeaseView, ...], placement: Placement | None
) -> list[LeaseView]:
    """Return the task's leases in the order of its placement's members (the placement's
    pool first), so that ``lease`` is the lease on ``placement.poolId`` and ``leases`` name
    the pools of ``placement.members`` in the same order; leases on other pools follow."""
    if len(leases) < 2 or placement is None:
        return list(leases)
    rank = {m["poolId"]: i for i, m in enumerate(placement["members"])}
    rank.setdefault(placement["poolId"], -1)
    return sorted(leases, key=lambda lease: (rank.get(lease.pool_id, len(rank)), lease.pool_id))


def task_json(row: TaskRow, queue: TaskQueue | None = None) -> Task:
    """Return a task row in the task shape (values orjson serializes); ``queue`` is the
    position document of an ADMITTED task read one at a time (getTask)."""
    placement = (
        None if row.placement is None
        else placement_document(row.placement, hidden=row.hidden_pool_ids)
    )
    leases = [_lease_json(lease) for lease in _leases_in_member_order(row.leases, placement)]
    return {
        "id": row.id,
        "tenantId": row.tenant_id,
        "state": row.state,
        "spec": row.spec,
        "priority": row.priority,
        "attempts": row.attempts,
        "maxAttempts": row.max_attempts,
        "createdAt": row.created_at,
        "updatedAt": row.updated_at,
        "leasedAt": row.leased_at,
        "finishedAt": row.finished_at,
        "pendingReason": pending_reason_json(row.pending_reason)
        if row.state == "ADMITTED"
        else None,
        "placement": placement,
        "lease": leases[0] if leases else None,
        "leases": leases,
        "failureReason": row.failure_reason,
        "queue": queue,
    }


def task_event_json(event: TaskEventRow, event_id: str) -> TaskEvent:
    """Return a task event in the API shape, with its opaque id."""
    return {
        "id": event_id,
        "at": event.at,
        "fromState": event.from_state,
        "toState": event.to_state,
        "reason": event.reason,
        "detail": event.detail,
    }
