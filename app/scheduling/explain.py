"""The documents Berth stores and serves for the core's results, each built in one place.

``select`` returns data (:mod:`app.scheduling.results`); the reconciler stores a task's
placement and pending reason as JSON and the preview endpoint serves a whole result. Every
such document is built here, from core data, in the SPEC §6 shapes: scores and component
values rounded to 4 places, pools named by id, reasons by their codes.

A lean placement is stored as its plain values (:func:`ranked_stored`, a JSON array) and its
document is rendered when it is read (:func:`placement_read`): the reconciler writes one per
placement, the API reads a few.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from app.scheduling.preemption import Preemption, Victim
    from app.scheduling.results import (
        Candidate,
        NoPlacement,
        Placement,
        Ranked,
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
    "ranked_json",
    "ranked_stored",
    "ranked_text",
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
        "score": round(scores[0], 4),
        "components": [
            {"name": n, "value": round(v, 4), "reason": r} for n, v, r in ranked.components
        ],
        "members": [{"poolId": pool, "count": 1}],
        "alternatives": [
            {"poolId": ids[i], "score": round(scores[i], 4)}
            for i in range(1, min(len(ids), ranked.top_k))
        ],
    }


#: JSON texts of the strings placement documents repeat (pool ids; each component's name
#: and reason around its value), bounded like the compiled specs a reconciler keeps.
_TEXTS_KEPT = 4096
_pool_texts: dict[str, str] = {}
_component_texts: dict[tuple[str, str], tuple[str, str]] = {}


def _pool_text(pool_id: str) -> str:
    text = _pool_texts.get(pool_id)
    if text is None:
        if len(_pool_texts) >= _TEXTS_KEPT:
            _pool_texts.clear()
        text = _pool_texts[pool_id] = orjson.dumps(pool_id).decode()
    return text


def _component_text(name: str, reason: str) -> tuple[str, str]:
    text = _component_texts.get((name, reason))
    if text is None:
        if len(_component_texts) >= _TEXTS_KEPT:
            _component_texts.clear()
        text = _component_texts[(name, reason)] = (
            '{"name":' + orjson.dumps(name).decode() + ',"value":',
            ',"reason":' + orjson.dumps(reason).decode() + "}",
        )
    return text


#: A float's fixed-point text with four places: ``_FIXED % x == f"{x:.4f}"`` (the same
#: float formatting), for about 0.1 µs less per number (no format spec parsed per call).
_FIXED = "%.4f"


def _number(x: float) -> str:
    """Return the JSON text of ``round(x, 4)`` as orjson writes it.

    Below 1e9 in magnitude that is the fixed-point text with four places, trailing zeros
    dropped (one digit kept after the point): ``round`` and the ``.4f`` format round the
    same way (correctly, half to even on the exact binary value), and at that magnitude the
    rounded float's shortest text is those digits (its neighbours with at most four places
    are far more than one unit in the last place apart), which orjson writes without an
    exponent down to 1e-4. ``round`` itself formats, parses back and formats again.
    Elsewhere (and for inf and nan) orjson writes the rounded float.
    """
    if -1e9 < x < 1e9:
        text = (_FIXED % x).rstrip("0")
        return text + "0" if text[-1] == "." else text
    return orjson.dumps(round(x, 4)).decode()


#: The JSON text of a whole component, by its ``(name, value, reason)``.
_component_values: dict[tuple[str, float, str], str] = {}
#: ``{"poolId":<pool>,"score":`` of an alternative, by pool id (see :func:`ranked_text`).
_alternative_heads: dict[str, str] = {}


def _alternative_head(pool_id: str) -> str:
    head = _alternative_heads.get(pool_id)
    if head is None:
        if len(_alternative_heads) >= _TEXTS_KEPT:
            _alternative_heads.clear()
        head = _alternative_heads[pool_id] = '{"poolId":' + _pool_text(pool_id) + ',"score":'
    return head


def ranked_text(ranked: Ranked) -> str:
    """Return ``orjson.dumps(ranked_document(ranked))`` as text, character for character,
    without building the document: the reconciler stores one per placement, and the dicts,
    lists and rounded floats of a document cost more than serializing it (numbers as
    :func:`_number` writes them).
    """
    ids = ranked.pool_ids
    scores = ranked.scores
    pool = _pool_texts.get(ids[0]) or _pool_text(ids[0])
    components = []
    for component in ranked.components:
        # Most components repeat whole (a pool's cost, an empty domain's spread).
        text = _component_values.get(component)
        if text is None:
            name, value, reason = component
            head, tail = _component_texts.get((name, reason)) or _component_text(name, reason)
            # Only values whose equals all have this text are kept (not 0.0 and -0.0; no
            # int beyond the fixed-point range, which orjson writes without the point).
            text = head + _number(value) + tail
            if type(value) is float and value and -1e9 < value < 1e9:
                if len(_component_values) >= _TEXTS_KEPT:
                    _component_values.clear()
                _component_values[component] = text
        components.append(text)
    alternatives = [
        (_alternative_heads.get(ids[i]) or _alternative_head(ids[i])) + _number(scores[i]) + "}"
        for i in range(1, min(len(ids), ranked.top_k))
    ]
    return (f'{{"poolId":{pool},"score":{_number(scores[0])},'
            f'"components":[{",".join(components)}],'
            f'"members":[{{"poolId":{pool},"count":1}}],'
            f'"alternatives":[{",".join(alternatives)}]}}')


def ranked_json(ranked: Ranked) -> bytes:
    """Return ``orjson.dumps(ranked_document(ranked))``, byte for byte (:func:`ranked_text`
    encoded)."""
    return ranked_text(ranked).encode()


#: The first element of a stored lean placement (:func:`ranked_stored`): its form's version.
STORED_RANKED = 1


def ranked_stored(ranked: Ranked) -> str:
    """Return a lean placement as the text the reconciler stores: the JSON array
    ``[1, pool ids, scores, components]`` of its best ``top_k`` pools (the chosen one first),
    their scores and its ``(name, value, reason)`` components, numbers unrounded.

    :func:`placement_read` renders it as :func:`ranked_document` of the same placement, key for
    key and number for number (orjson writes a float's shortest text, which reads back as the
    same float, and rounds nothing). One C call instead of :func:`ranked_text`'s formatting:
    about 8k instructions instead of 40k per placement (the bench mix, callgrind).
    """
    ids = ranked.pool_ids
    n = min(len(ids), ranked.top_k)
    if n < 1:
        n = 1
    try:
        return orjson.dumps(
            (STORED_RANKED, ids[:n], ranked.scores[:n], ranked.components)
        ).decode()
    except TypeError:  # a value orjson does not write (none of the core's): the document
        return ranked_text(ranked)


def placement_read(text: str) -> dict[str, Any]:
    """Return the placement document of a stored placement text: a document as stored, or the
    :func:`ranked_document` of a lean placement stored by :func:`ranked_stored`."""
    value = orjson.loads(text)
    if type(value) is not list:
        return value
    _, ids, scores, components = value
    pool = ids[0]
    # orjson wrote inf and nan as null, as it writes them in a document.
    return {
        "poolId": pool,
        "score": _rounded(scores[0]),
        "components": [
            {"name": n, "value": _rounded(v), "reason": r} for n, v, r in components
        ],
        "members": [{"poolId": pool, "count": 1}],
        "alternatives": [
            {"poolId": ids[i], "score": _rounded(scores[i])} for i in range(1, len(ids))
        ],
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


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
