"""Response models of tasks and placement previews (SPEC §6), and the row -> JSON mapping.

The models document the shapes in the OpenAPI document; the hot endpoints build the JSON
directly with :func:`task_json` (plain dicts serialized by orjson) instead of validating
response objects, and tests check that both agree.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

import orjson
from fastapi.responses import Response
from pydantic import ConfigDict, Field

from app.api.common import CamelModel, Page
from app.ledger.tables import TASK_STATES
from app.ledger.tasks import LeaseView, TaskEventRow, TaskRow
from app.scheduling.explain import placement_document
from app.scheduling.spec import TaskSpec


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


class ScoreComponent(CamelModel):
    """One score plugin's weighted contribution to a pool's total, with a short reason."""

    name: str = Field(description="Score plugin name, e.g. `least_loaded`, `cost`.")
    value: float = Field(description="Weighted contribution to the total score.")
    reason: str = Field(description="Why the plugin scored the pool this way.")


class PlacementMember(CamelModel):
    """How many members of the task are placed on a pool (1 for a plain task)."""

    pool_id: str
    count: int = Field(ge=1)


class PlacementAlternative(CamelModel):
    """A feasible pool that ranked below the chosen one."""

    pool_id: str
    score: float


_COMPONENTS_EXAMPLE = [
    {
        "name": "least_loaded",
        "value": 84.3807,
        "reason": "projected utilization 16% dominant, 10% mean; lower is better",
    },
    {"name": "cost", "value": 100.0, "reason": "cost weight 1; cheaper pools score higher"},
    {"name": "artifact_locality", "value": 100.0, "reason": "artifacts in eu-west-1 are local"},
]
_PLACEMENT_EXAMPLE = {
    "poolId": "eu-gpu-1",
    "score": 284.3807,
    "components": _COMPONENTS_EXAMPLE,
    "members": [{"poolId": "eu-gpu-1", "count": 1}],
    "alternatives": [{"poolId": "eu-gpu-2", "score": 143.7698}],
}


class Placement(CamelModel):
    """Where the task was placed and why: the chosen pool, its score and the runners-up."""

    model_config = ConfigDict(json_schema_extra={"examples": [_PLACEMENT_EXAMPLE]})

    pool_id: str = Field(description="The chosen pool (the first member's, for a gang).")
    score: float = Field(description="Total score of the chosen pool (sum of components).")
    components: list[ScoreComponent]
    members: list[PlacementMember] = Field(description="Every pool holding members, with counts.")
    alternatives: list[PlacementAlternative] = Field(
        description="The next-ranked feasible pools, best first."
    )


class PendingReason(CamelModel):
    """Why an admitted task is not placed now: headline code, a sentence, counts by code."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "code": "insufficient_cpu",
                    "message": "0/4 pools fit: 3 lack cpu (closest), 1 is cordoned or draining",
                    "rejections": {"insufficient_cpu": 3, "pool_not_active": 1},
                }
            ]
        }
    )

    code: str = Field(
        description="The headline reason code: the closest miss, the code of the latest stage "
        "any pool reached (ties: the most pools); `preempting` while the task waits for the "
        "lower-priority tasks it displaced to stop."
    )
    message: str = Field(description="A human sentence; names no pool.")
    rejections: dict[str, int] = Field(description="Number of visible pools rejected, by code.")
    victims: int | None = Field(
        default=None, description="`preempting` only: tasks the task waits for to stop."
    )
    revoke_by: datetime | None = Field(
        default=None, description="`preempting` only: when its victims are revoked at the latest."
    )


class TaskQueue(CamelModel):
    """Where an admitted task stands under the active policy, and when it may start."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "position": 13,
                    "competing": 40,
                    "exact": True,
                    "policy": "fifo",
                    "estimatedStartAt": "2026-12-01T12:03:15Z",
                    "estimate": "about 3 minutes: 12 tasks ahead; leases on its 3 candidate "
                    "pools completed at 4.0 per minute over the last 15 minutes (each "
                    "completion is assumed to free room for one waiting task)",
                }
            ]
        }
    )

    position: int = Field(ge=1, description="1 + the competing tasks ahead under the policy.")
    competing: int = Field(
        ge=0, description="Waiting tasks of the runtime class that released capacity could help."
    )
    exact: bool = Field(description="False: a count reached the read bound (lower bounds).")
    policy: str = Field(description="The policy the position is counted under.")
    estimated_start_at: datetime | None = Field(
        description="Only when capacity is the only blocker and completions were observed."
    )
    estimate: str = Field(description="How the estimate was made, or why there is none.")


class TaskLease(CamelModel):
    """The grant a runtime instance holds while it runs the task."""

    id: uuid.UUID
    pool_id: str
    runtime_instance_id: str
    expires_at: datetime
    epoch: int = Field(ge=1, description="Fencing epoch; lease completion must name it.")
    state: Literal["ACTIVE", "REVOKING"] = Field(
        default="ACTIVE", description="`REVOKING`: preempted; the runtime stops by `revokeBy`."
    )
    revoke_by: datetime | None = Field(default=None, description="Set while `REVOKING`.")


class Task(CamelModel):
    """A task: its spec, state, explanation (placement or pending reason) and lease."""

    id: uuid.UUID
    tenant_id: str
    state: TaskState
    spec: TaskSpec
    priority: int
    attempts: int = Field(ge=0, description="Leases of this task that expired or were revoked.")
    max_attempts: int = Field(ge=1)
    created_at: datetime
    updated_at: datetime
    leased_at: datetime | None
    finished_at: datetime | None
    pending_reason: PendingReason | None = Field(
        description="Set while ADMITTED and no pool fits now."
    )
    placement: Placement | None = Field(description="Set once placed (LEASED and after).")
    lease: TaskLease | None = Field(
        description="The live lease on `placement.poolId` (a gang's first member's pool)."
    )
    leases: list[TaskLease] = Field(
        description="Every live lease, one per pool of a gang, in `placement.members` order."
    )
    failure_reason: str | None = Field(description="Set when FAILED or CANCELLED.")
    queue: TaskQueue | None = Field(
        default=None,
        description="Where the task stands while ADMITTED (getTask only; null in lists).",
    )


class TaskEvent(CamelModel):
    """One transition of a task, with a bounded reason code."""

    id: int
    at: datetime
    from_state: TaskState | None
    to_state: TaskState
    reason: str
    detail: dict[str, Any] | None


class TaskPage(Page[Task]):
    """One page of tasks, in admission order."""


class TaskEventPage(Page[TaskEvent]):
    """One page of a task's transitions, oldest first."""


class PlacementCandidate(CamelModel):
    """A feasible pool in the ranking, with its score components."""

    pool_id: str
    score: float
    components: list[ScoreComponent]


class PlacementRejection(CamelModel):
    """A pool visible to the tenant that a filter rejected."""

    pool_id: str
    reasons: list[str]


class PreemptionVictim(CamelModel):
    """A leased task of the tenant, of lower priority, that a preemption would displace."""

    task_id: str
    priority: int
    members: list[PlacementMember]


class PreemptionCandidate(CamelModel):
    """A pool where displacing ``victims`` would make room, with its score."""

    pool_id: str
    score: float
    victims: list[PreemptionVictim]


class PreemptionPreview(CamelModel):
    """The preemption a task with `preemption: "lowerPriority"` would make now."""

    pool_id: str = Field(description="The pool it would take (the first member's, for a gang).")
    members: list[PlacementMember]
    victims: list[PreemptionVictim] = Field(description="The tasks it would displace.")
    candidates: list[PreemptionCandidate] = Field(
        description="Every pool where displacing lower-priority tasks would make room, with "
        "the victims each would need, cheapest set first."
    )


class PlacementPreview(CamelModel):
    """A dry-run decision on the live snapshot: nothing is reserved."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "placement": _PLACEMENT_EXAMPLE,
                    "candidates": [
                        {"poolId": "eu-gpu-1", "score": 284.3807,
                         "components": _COMPONENTS_EXAMPLE},
                        {"poolId": "eu-gpu-2", "score": 143.7698, "components": []},
                    ],
                    "rejected": [{"poolId": "eu-gpu-3", "reasons": ["runtime_unhealthy"]}],
                    "reason": None,
                }
            ]
        }
    )

    placement: Placement | None
    candidates: list[PlacementCandidate] = Field(description="Every feasible pool, best first.")
    rejected: list[PlacementRejection] = Field(
        description="Every rejected pool visible to the tenant."
    )
    reason: PendingReason | None = Field(description="Why nothing fits (null if placed).")
    preemption: PreemptionPreview | None = Field(
        default=None,
        description="For a spec that may preempt and fits nowhere: the lower-priority tasks "
        "of the tenant it would displace (null otherwise).",
    )


class FastJSONResponse(Response):
    """A JSON response serialized by orjson from plain values (no response model pass).

    Datetimes are written RFC 3339 with ``Z`` for UTC, as pydantic writes them in the other
    answers (SPEC §6: one timestamp format); the ledger's datetimes are all UTC.
    """

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Return ``content`` as JSON bytes."""
        return orjson.dumps(content, option=orjson.OPT_UTC_Z)


# --- row -> JSON -----------------------------------------------------------------------------


def pending_reason_json(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return a stored pending reason in the API shape."""
    if not raw or "code" not in raw:
        return None
    doc: dict[str, Any] = {
        "code": str(raw["code"]),
        "message": str(raw.get("message", "")),
        "rejections": {str(k): int(v) for k, v in (raw.get("rejections") or {}).items()},
    }
    if "victims" in raw:
        doc["victims"] = int(raw["victims"])
        doc["revokeBy"] = raw.get("revokeBy")
    return doc


def _lease_json(lease: LeaseView) -> dict[str, Any]:
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
    leases: tuple[LeaseView, ...], placement: dict[str, Any] | None
) -> list[LeaseView]:
    """Return the task's leases in the order of its placement's members (the placement's
    pool first), so that ``lease`` is the lease on ``placement.poolId`` and ``leases`` name
    the pools of ``placement.members`` in the same order; leases on other pools follow."""
    if len(leases) < 2 or placement is None:
        return list(leases)
    rank = {m["poolId"]: i for i, m in enumerate(placement["members"])}
    rank.setdefault(placement["poolId"], -1)
    return sorted(leases, key=lambda lease: (rank.get(lease.pool_id, len(rank)), lease.pool_id))


def task_json(row: TaskRow, queue: dict[str, Any] | None = None) -> dict[str, Any]:
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


def task_event_json(event: TaskEventRow) -> dict[str, Any]:
    """Return a task event in the API shape."""
    return {
        "id": event.id,
        "at": event.at,
        "fromState": event.from_state,
        "toState": event.to_state,
        "reason": event.reason,
        "detail": event.detail,
    }
