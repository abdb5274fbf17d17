"""The documents Berth stores and serves for the core's results, each built in one place.

``select`` returns data (:mod:`app.scheduling.results`); the reconciler stores a task's
placement and pending reason as JSON and the preview endpoint serves a whole result. Every
such document is built here, from core data: scores and component values rounded to 4
places, pools named by id, reasons by their codes.

A placement is stored in one format, a JSON array led by its version
(:data:`PLACEMENT_FORMAT`)::

    [2, [chosen pool, alternative, ...], [score, ...], [[name, value, reason], ...],
     [[pool, count], ...], [walked-from pool, ...]]

the chosen pool first with the alternatives after it, best first; the components of the
chosen pool's score; every member's pool with its count; and the better-ranked pools the
reservation walked past after a lost race (empty when it did not). Numbers are unrounded. An
array rather than an object: it is the cheaper of the two to write, and the reconciler writes
one per placement (:func:`placement_stored`, :func:`ranked_stored`); the API renders the few
it reads (:func:`placement_document`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
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
    "PLACEMENT_FORMAT",
    "PlacementFormatUnknown",
    "placement_document",
    "placement_stored",
    "preemption_document",
    "preview_document",
    "ranked_stored",
    "rejection_document",
]


def component_document(component: ScoreComponent) -> dict[str, Any]:
    """Build a score component's document ``{"name", "value", "reason"}``."""
    return {"name": component.name, "value": round(component.value, 4), "reason": component.reason}


def placement_stored(
    candidate: Candidate | Placement,
    *,
    members: Iterable[tuple[str, int]],
    alternatives: Iterable[Candidate],
    walked_from: Sequence[str] = (),
) -> str:
    """Return the stored text of a placement: the chosen pool with its score and components,
    every member's pool, the alternatives, and the better-ranked pools the reservation walked
    past (``walked_from``, best first; empty when it did not walk)."""
    alternatives = tuple(alternatives)
    return _stored(
        [candidate.pool_id, *(a.pool_id for a in alternatives)],
        [candidate.score, *(a.score for a in alternatives)],
        [(c.name, c.value, c.reason) for c in candidate.components],
        tuple(members),
        walked_from,
    )


def ranked_stored(ranked: Ranked) -> str:
    """Return the stored text of a lean placement: its best ``top_k`` pools (the chosen one
    first) with their scores, and its components, on one member."""
    ids = ranked.pool_ids
    n = max(min(len(ids), ranked.top_k), 1)
    return _stored(ids[:n], ranked.scores[:n], ranked.components, ((ids[0], 1),), ())


#: The version of the stored placement format: the first element of every stored placement.
PLACEMENT_FORMAT = 2


def _stored(
    pools: Sequence[str],
    scores: Sequence[float],
    components: Sequence[tuple[str, float, str]],
    members: Sequence[tuple[str, int]],
    walked_from: Sequence[str],
) -> str:
    # orjson writes a float's shortest text, which reads back as the same float.
    return orjson.dumps(
        (PLACEMENT_FORMAT, pools, scores, components, members, walked_from)
    ).decode()


class PlacementFormatUnknown(ValueError):
    """A stored placement is not in the format this version of Berth reads."""


def placement_document(text: str, *, hidden: Collection[str] = ()) -> dict[str, Any]:
    """Return the served document of a stored placement ``{"poolId", "score", "components",
    "members", "alternatives"}``, numbers rounded to 4 places, without the alternatives named
    in ``hidden`` (pools the tenant can no longer see)."""
    stored = orjson.loads(text)
    if type(stored) is not list or stored[0] != PLACEMENT_FORMAT:
        raise PlacementFormatUnknown(f"stored placement is not format {PLACEMENT_FORMAT}")
    _, pools, scores, components, members, _walked_from = stored
    return {
        "poolId": pools[0],
        "score": _rounded(scores[0]),
        "components": [
            {"name": n, "value": _rounded(v), "reason": r} for n, v, r in components
        ],
        "members": [{"poolId": p, "count": c} for p, c in members],
        "alternatives": [
            {"poolId": pools[i], "score": _rounded(scores[i])}
            for i in range(1, len(pools))
            if pools[i] not in hidden
        ],
    }


def _rounded(x: float | None) -> float | None:
    # None: an inf or nan, which orjson writes as null.
    return None if x is None else float(round(x, 4))


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
        else placement_document(placement_stored(
            placement, members=placement.members, alternatives=placement.alternatives
        )),
        "candidates": [candidate_document(c) for c in result.candidates],
        "rejected": [rejection_document(r) for r in result.rejected],
        "reason": None if result.reason is None else no_placement_document(result.reason),
        "preemption": None if preemption is None else preemption_document(preemption),
    }
