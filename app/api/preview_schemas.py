"""The placement preview's answer: one page of the decision, with counts of the rest."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from app.scheduling.explain import (
    DOCUMENT,
    PendingReason,
    Placement,
    PlacementCandidate,
    PlacementRejection,
    PreemptionPreview,
)

__all__ = ["PlacementPreview", "RejectedByReason"]


@with_config(DOCUMENT)
class RejectedByReason(TypedDict):
    """How many visible pools one reason code rejected, and the first of them."""

    code: str
    count: int
    poolIds: Annotated[list[str], Field(description="The first 20 of these pools.")]


@with_config(ConfigDict(
    extra="forbid",
    json_schema_extra={
        "examples": [
            {
                "placement": None,
                "candidates": [{"poolId": "eu-gpu-1", "score": 284.3807, "components": []}],
                "rejected": [{"poolId": "eu-gpu-3", "reasons": ["runtime_unhealthy"]}],
                "reason": None,
                "candidateCount": 1,
                "rejectedCount": 1,
                "rejectedByReason": [
                    {"code": "runtime_unhealthy", "count": 1, "poolIds": ["eu-gpu-3"]}
                ],
                "preemption": None,
                "nextCursor": None,
            }
        ]
    },
))
class PlacementPreview(TypedDict):
    """A dry-run decision on the live snapshot, one page of it: nothing is reserved."""

    placement: Placement | None
    candidates: Annotated[list[PlacementCandidate], Field(
        description="The feasible pools of this page (`limit` at most), best first."
    )]
    rejected: Annotated[list[PlacementRejection], Field(
        description="The rejected pools visible to the tenant of this page (`limit` at most)."
    )]
    reason: Annotated[
        PendingReason | None, Field(description="Why nothing fits (null if placed).")
    ]
    candidateCount: Annotated[int, Field(description="Every feasible pool.")]
    rejectedCount: Annotated[int, Field(description="Every rejected pool visible to the tenant.")]
    rejectedByReason: Annotated[list[RejectedByReason], Field(
        description="The rejected pools by reason code, most common first."
    )]
    preemption: Annotated[PreemptionPreview | None, Field(
        description="For a spec that may preempt and fits nowhere: the lower-priority tasks "
        "of the tenant it would displace, and the best `limit` pools where it could (null "
        "otherwise)."
    )]
    nextCursor: Annotated[str | None, Field(
        description="The cursor of the next page of candidates and rejected pools (null on "
        "the last)."
    )]
