"""The documents Berth stores and serves for the core's results, each built in one place.

``select`` returns data (:mod:`app.scheduling.results`); the reconciler stores a task's
placement and pending reason as JSON and the preview endpoint serves a whole result. Every
such document is built here, from core data, in the API's shapes: scores and component
values rounded to 4 places, pools named by id, reasons by their codes.

A lean placement is stored as its plain values (:func:`ranked_stored`, a JSON array) and its
document is rendered when it is read (:func:`placement_read`): the reconciler writes one per
placement, the API reads a few.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from app.scheduling.results import Ranked

if TYPE_CHECKING:
    from app.scheduling.preemption import Preemption, Victim
    from app.scheduling.results import (
        Candidate,
        NoPlacement,
        Placement,
        Rejection,
        Result,
        ScoreComponent,
    )

__all__ = [
    "candidate_document",
    "component_document",
    "no_placement_document",
    "placement_document",
    "placement_read",
    "preemption_document",
    "preview_document",
    "ranked_document",
    "ranked_stored",
    "rejection_document",
]


def component_document(component: ScoreComponent) -> dict[str, Any]:
    """Build a score component's document ``{"name", "value", "reason"}``."""
    return {"name": component.name, "value": round(component.value, 4), "reason": component.reason}


def placement_document(
    candidate: Candidate | Placement,
    *,
    members: Iterable[tuple[str, int]],
    alternatives: Iterable[Candidate],
    walked_from: Sequence[str] = (),
) -> dict[str, Any]:
    """Build the stored and served placement: the chosen pool with its score and components,
    every member's pool, the alternatives, and ``walkedFrom`` only when the reservation walked
    past better-ranked pools (those named in ``walked_from``, best first)."""
    # Built inline (no per-item calls): the reconciler stores one per placement.
    doc: dict[str, Any] = {
        "poolId": candidate.pool_id,
        "score": round(candidate.score, 4),
        "components": [
            {"name": c.name, "value": round(c.value, 4), "reason": c.reason}
            for c in candidate.components
        ],
        "members": [{"poolId": p, "count": c} for p, c in members],
        "alternatives": [{"poolId": a.pool_id, "score": round(a.score, 4)} for a in alternatives],
    }
    if walked_from:
        doc["walkedFrom"] = list(walked_from)
    return doc


def ranked_document(ranked: Ranked) -> dict[str, Any]:
    """Build the placement document of a lean placement (:class:`Ranked`): the same document
    as :func:`placement_document` of its :meth:`~Ranked.result`, from the plain values."""
    ids = ranked.pool_ids
    scores = ranked.scores
    pool = ids[0]
    # The alternatives are the ranked pools after the first, at most top_k - 1 of them.
    return {
        "poolId": pool,
        "score": _rounded(scores[0]),
        "components": [
            {"name": n, "value": _rounded(v), "reason": r} for n, v, r in ranked.components
        ],
        "members": [{"poolId": pool, "count": 1}],
        "alternatives": [
            {"poolId": ids[i], "score": _rounded(scores[i])}
            for i in range(1, min(len(ids), ranked.top_k))
        ],
    }


def _rounded(x: float | None) -> float | None:
    # None: an inf or nan that orjson wrote as null in a stored placement (a document
    # writes them as null too).
    return None if x is None else round(x, 4)


#: The first element of a stored lean placement (:func:`ranked_stored`): its form's version.
STORED_RANKED = 1


def ranked_stored(ranked: Ranked) -> str:
    """Return a lean placement as the text the reconciler stores: the JSON array
    ``[1, pool ids, scores, components]`` of its best ``top_k`` pools (the chosen one first),
    their scores and its ``(name, value, reason)`` components, numbers unrounded.

    :func:`placement_read` renders it as :func:`ranked_document` of the same placement, key for
    key and number for number (orjson writes a float's shortest text, which reads back as the
    same float, and rounds nothing). One C call: about 8k instructions per placement, against
    40k for the document text that was stored before (the bench mix, callgrind).
    """
    ids = ranked.pool_ids
    n = max(min(len(ids), ranked.top_k), 1)
    return orjson.dumps((STORED_RANKED, ids[:n], ranked.scores[:n], ranked.components)).decode()


def placement_read(text: str) -> dict[str, Any]:
    """Return the placement document of a stored placement text: a document as stored, or the
    :func:`ranked_document` of a lean placement stored by :func:`ranked_stored`."""
    value = orjson.loads(text)
    if type(value) is not list:
        return value
    _, ids, scores, components = value
    return ranked_document(Ranked(ids, scores, components, len(ids), {}))


def no_placement_document(reason: NoPlacement) -> dict[str, Any]:
    """Build the pending reason ``{"code", "message", "rejections"}`` of a task that fits
    nowhere (rejections: pools per reason code)."""
    return {
        "code": str(reason.code),
        "message": reason.message,
        "rejections": {str(k): int(v) for k, v in reason.rejections.items()},
    }


def candidate_document(candidate: Candidate) -> dict[str, Any]:
    """Build a ranked candidate's document ``{"poolId", "score", "components"}``."""
    return {
        "poolId": candidate.pool_id,
        "score": round(candidate.score, 4),
        "components": [component_document(c) for c in candidate.components],
    }


def rejection_document(rejection: Rejection) -> dict[str, Any]:
    """Build a rejected pool's document ``{"poolId", "reasons"}``."""
    return {"poolId": rejection.pool_id, "reasons": list(rejection.reasons)}


def _victim_document(victim: Victim) -> dict[str, Any]:
    return {
        "taskId": victim.task_id,
        "priority": victim.priority,
        "members": [{"poolId": p, "count": c} for p, c in victim.members],
    }


def preemption_document(preemption: Preemption) -> dict[str, Any]:
    """Build a planned preemption: the pool and members it would take, the victims it would
    displace there, and every candidate pool with the victims it would need, cheapest first."""
    return {
        "poolId": preemption.pool_id,
        "members": [{"poolId": p, "count": c} for p, c in preemption.members],
        "victims": [_victim_document(v) for v in preemption.victims],
        "candidates": [
            {"poolId": c.pool_id, "score": round(c.score, 4),
             "victims": [_victim_document(v) for v in c.victims]}
            for c in preemption.candidates
        ],
    }


def preview_document(result: Result, preemption: Preemption | None = None) -> dict[str, Any]:
    """Build the placement preview ``{"placement", "candidates", "rejected", "reason",
    "preemption"}`` of a whole result (and of the preemption a preemptor would make)."""
    placement = result.placement
    return {
        "placement": None
        if placement is None
        else placement_document(
            placement, members=placement.members, alternatives=placement.alternatives
        ),
        "candidates": [candidate_document(c) for c in result.candidates],
        "rejected": [rejection_document(r) for r in result.rejected],
        "reason": None if result.reason is None else no_placement_document(result.reason),
        "preemption": None if preemption is None else preemption_document(preemption),
    }
