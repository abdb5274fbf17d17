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

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, NotRequired

import orjson
from pydantic import ConfigDict, Field, with_config
from pydantic.json_schema import JsonDict, JsonValue
from typing_extensions import TypedDict

from app.scheduling.records import NOMINATED, PREEMPTING, RECLAIMING, Vector
from app.scheduling.results import Ranked

if TYPE_CHECKING:
    from app.scheduling.preemption import Preemption, Victim
    from app.scheduling.results import Candidate, NoPlacement, Rejection, Result
    from app.scheduling.results import Placement as Placed
    from app.scheduling.results import ScoreComponent as Component

__all__ = [
    "DOCUMENT",
    "PendingReason",
    "Placement",
    "PlacementAlternative",
    "PlacementCandidate",
    "PlacementMember",
    "PlacementPreview",
    "PlacementRejection",
    "PreemptionCandidate",
    "PreemptionPreview",
    "PreemptionVictim",
    "QueueItem",
    "QueueSummary",
    "TaskQueue",
    "ScoreComponent",
    "candidate_document",
    "component_document",
    "error_document",
    "no_placement_document",
    "nominated_document",
    "preempting_document",
    "reclaiming_document",
    "waiting_document",
    "PLACEMENT_FORMAT",
    "PlacementFormatUnknown",
    "placement_document",
    "placement_stored",
    "preemption_document",
    "preview_document",
    "queue_document",
    "duration_words",
    "plural_words",
    "queue_eta",
    "queue_summary_document",
    "ranked_stored",
    "rejection_document",
]


#: The pydantic configuration of every served document (its JSON schema is the API's): no
#: field beyond those declared.
DOCUMENT = ConfigDict(extra="forbid")


@with_config(DOCUMENT)
class ScoreComponent(TypedDict):
    """One score plugin's weighted contribution to a pool's total, with a short reason."""

    name: Annotated[str, Field(description="Score plugin name, e.g. `least_loaded`, `cost`.")]
    value: Annotated[float, Field(description="Weighted contribution to the total score.")]
    reason: Annotated[str, Field(description="Why the plugin scored the pool this way.")]


@with_config(DOCUMENT)
class PlacementMember(TypedDict):
    """How many members of the task are placed on a pool (1 for a plain task)."""

    poolId: str
    count: Annotated[int, Field(ge=1)]


@with_config(DOCUMENT)
class PlacementAlternative(TypedDict):
    """A feasible pool that ranked below the chosen one."""

    poolId: str
    score: float


_COMPONENTS_EXAMPLE: list[JsonValue] = [
    {
        "name": "least_loaded",
        "value": 84.3807,
        "reason": "projected utilization 16% dominant, 10% mean; lower is better",
    },
    {"name": "cost", "value": 100.0, "reason": "cost weight 1; cheaper pools score higher"},
    {"name": "artifact_locality", "value": 100.0, "reason": "artifacts in eu-west-1 are local"},
]
_PLACEMENT_EXAMPLE: JsonDict = {
    "poolId": "eu-gpu-1",
    "score": 284.3807,
    "components": _COMPONENTS_EXAMPLE,
    "members": [{"poolId": "eu-gpu-1", "count": 1}],
    "alternatives": [{"poolId": "eu-gpu-2", "score": 143.7698}],
}


@with_config(ConfigDict(extra="forbid", json_schema_extra={"examples": [_PLACEMENT_EXAMPLE]}))
class Placement(TypedDict):
    """Where the task was placed and why: the chosen pool, its score and the runners-up."""

    poolId: Annotated[
        str, Field(description="The chosen pool (the first member's, for a gang).")
    ]
    score: Annotated[
        float, Field(description="Total score of the chosen pool (sum of components).")
    ]
    components: list[ScoreComponent]
    members: Annotated[
        list[PlacementMember], Field(description="Every pool holding members, with counts.")
    ]
    alternatives: Annotated[
        list[PlacementAlternative],
        Field(description="The next-ranked feasible pools, best first."),
    ]


@with_config(ConfigDict(
    extra="forbid",
    json_schema_extra={
        "examples": [
            {
                "code": "insufficient_cpu",
                "message": "0/4 pools fit: 3 lack cpu (closest), 1 is cordoned or draining",
                "rejections": {"insufficient_cpu": 3, "pool_not_active": 1},
            }
        ]
    },
))
class PendingReason(TypedDict):
    """Why an admitted task is not placed now: headline code, a sentence, counts by code."""

    code: Annotated[str, Field(
        description="The headline reason code: the closest miss, the code of the latest stage "
        "any pool reached (ties: the most pools); `preempting` while the task waits for the "
        "lower-priority tasks it displaced to stop, `reclaiming` while it waits for the "
        "borrowed leases of its cohort it takes back to stop, `nominated` while capacity "
        "freed on its pools is held for it (it starved)."
    )]
    message: Annotated[str, Field(description="A human sentence; names no pool.")]
    rejections: Annotated[
        dict[str, int], Field(description="Number of visible pools rejected, by code.")
    ]
    victims: NotRequired[Annotated[int | None, Field(
        default=None,
        description="`preempting` and `reclaiming` only: tasks the task waits for to stop."
    )]]
    revokeBy: NotRequired[Annotated[datetime | None, Field(
        default=None,
        description="`preempting` and `reclaiming` only: when its victims are revoked at the "
        "latest."
    )]]
    poolIds: NotRequired[Annotated[list[str] | None, Field(
        default=None, description="`nominated` only: the pools whose freed capacity is held "
        "for the task."
    )]]
    need: NotRequired[Annotated[dict[str, int] | None, Field(
        default=None, description="`nominated` only: what the task needs on those pools "
        "(`cpuMillis`, `memoryMiB`, `llmSlots`)."
    )]]
    held: NotRequired[Annotated[dict[str, int] | None, Field(
        default=None, description="`nominated` only: the capacity held for it so far, summed "
        "over those pools."
    )]]
    nominatedAt: NotRequired[Annotated[datetime | None, Field(
        default=None, description="`nominated` only: when the task was nominated."
    )]]


@with_config(DOCUMENT)
class PlacementCandidate(TypedDict):
    """A feasible pool in the ranking, with its score components."""

    poolId: str
    score: float
    components: list[ScoreComponent]


@with_config(DOCUMENT)
class PlacementRejection(TypedDict):
    """A pool visible to the tenant that a filter rejected."""

    poolId: str
    reasons: list[str]


@with_config(DOCUMENT)
class PreemptionVictim(TypedDict):
    """A leased task of the tenant, of lower priority, that a preemption would displace."""

    taskId: str
    priority: int
    members: list[PlacementMember]


@with_config(DOCUMENT)
class PreemptionCandidate(TypedDict):
    """A pool where displacing ``victims`` would make room, with its score."""

    poolId: str
    score: float
    victims: list[PreemptionVictim]


@with_config(DOCUMENT)
class PreemptionPreview(TypedDict):
    """The preemption a task with `preemption: "lowerPriority"` would make now."""

    poolId: Annotated[
        str, Field(description="The pool it would take (the first member's, for a gang).")
    ]
    members: list[PlacementMember]
    victims: Annotated[
        list[PreemptionVictim], Field(description="The tasks it would displace.")
    ]
    candidates: Annotated[list[PreemptionCandidate], Field(
        description="Every pool where displacing lower-priority tasks would make room, with "
        "the victims each would need, cheapest set first."
    )]


@with_config(ConfigDict(
    extra="forbid",
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
    },
))
class PlacementPreview(TypedDict):
    """A dry-run decision on the live snapshot: nothing is reserved."""

    placement: Placement | None
    candidates: Annotated[
        list[PlacementCandidate], Field(description="Every feasible pool, best first.")
    ]
    rejected: Annotated[
        list[PlacementRejection], Field(description="Every rejected pool visible to the tenant.")
    ]
    reason: Annotated[
        PendingReason | None, Field(description="Why nothing fits (null if placed).")
    ]
    preemption: NotRequired[Annotated[PreemptionPreview | None, Field(
        default=None,
        description="For a spec that may preempt and fits nowhere: the lower-priority tasks "
        "of the tenant it would displace (null otherwise).",
    )]]


def component_document(component: Component) -> ScoreComponent:
    """Build a score component's document ``{"name", "value", "reason"}``."""
    return {"name": component.name, "value": round(component.value, 4), "reason": component.reason}


def placement_stored(
    candidate: Candidate | Placed,
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


def placement_document(text: str, *, hidden: Collection[str] = ()) -> Placement:
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


def _rounded(x: float | None) -> float:
    # None: an inf or nan, which orjson writes as null (and writes nan as null again).
    return math.nan if x is None else float(round(x, 4))


def no_placement_document(reason: NoPlacement) -> PendingReason:
    """Build the pending reason ``{"code", "message", "rejections"}`` of a task that fits
    nowhere (rejections: pools per reason code)."""
    return {
        "code": str(reason.code),
        "message": reason.message,
        "rejections": {str(k): int(v) for k, v in reason.rejections.items()},
    }


def error_document(code: str, message: str) -> PendingReason:
    """Build the pending reason of a task the core could not evaluate (its stored spec
    cannot be read, the core failed on it, it has no attempt left)."""
    return {"code": code, "message": message, "rejections": {}}


def _at(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def waiting_document(
    code: str, message: str, victims: int, revoke_by: datetime, *,
    rejections: Mapping[str, int] | None = None, victim_ids: Iterable[str] = (),
    pool_ids: Iterable[str] = (),
) -> PendingReason:
    """Build the pending reason of a task waiting for ``victims`` leases to stop (a
    preemptor's or a reclaimer's): ``message`` is followed by the deadline."""
    doc: dict[str, Any] = {
        "code": code,
        "message": f"{message}, at the latest by {_at(revoke_by)}",
        "rejections": dict(rejections or {}),
        "victims": victims,
        "revokeBy": _at(revoke_by),
    }
    if victim_ids:
        doc["victimIds"] = list(victim_ids)
    if pool_ids:
        doc["poolIds"] = list(pool_ids)
    return doc  # type: ignore[return-value]


def preempting_document(
    victims: int, revoke_by: datetime, *, rejections: Mapping[str, int] | None = None,
    victim_ids: Iterable[str] = (), pool_ids: Iterable[str] = (),
) -> PendingReason:
    """Build the pending reason of a preemptor waiting for ``victims`` tasks to stop."""
    noun = "task" if victims == 1 else "tasks"
    return waiting_document(
        PREEMPTING, f"preempting: waiting for {victims} lower-priority {noun} of this tenant "
        "to stop", victims, revoke_by, rejections=rejections, victim_ids=victim_ids,
        pool_ids=pool_ids)


def reclaiming_document(
    victims: int, revoke_by: datetime, *, rejections: Mapping[str, int] | None = None,
    victim_ids: Iterable[str] = (), pool_ids: Iterable[str] = (), fair: bool = False,
) -> PendingReason:
    """Build the pending reason of a task waiting for ``victims`` borrowed leases (with
    ``fair``: taken from tenants above their fair share)."""
    noun = "lease" if victims == 1 else "leases"
    what = ("reclaiming its fair share" if fair else "reclaiming its tenant's nominal")
    return waiting_document(
        RECLAIMING, f"{what}: waiting for {victims} borrowed {noun} "
        "of its cohort to stop", victims, revoke_by, rejections=rejections,
        victim_ids=victim_ids, pool_ids=pool_ids)


def _resources(v: Vector) -> dict[str, int]:
    return {"cpuMillis": v[0], "memoryMiB": v[1], "llmSlots": v[2]}


def nominated_document(
    reason: NoPlacement | None, *, pool_ids: Sequence[str], need: Vector, held: Vector,
    since: datetime,
) -> PendingReason:
    """Build the pending reason of a nominated task: its pools, the holds gathered so far
    against its need, and since when it is nominated."""
    noun = "pool" if len(pool_ids) == 1 else "pools"
    doc: dict[str, Any] = {
        "code": NOMINATED,
        "message": f"nominated: capacity freed on its {len(pool_ids)} {noun} is held for "
        f"this task until it fits; tasks behind it use only capacity not held",
        "rejections": dict(reason.rejections) if reason is not None else {},
        "poolIds": list(pool_ids),
        "need": _resources(need),
        "held": _resources(held),
        "nominatedAt": _at(since),
    }
    return doc  # type: ignore[return-value]


def candidate_document(candidate: Candidate) -> PlacementCandidate:
    """Build a ranked candidate's document ``{"poolId", "score", "components"}``."""
    return {
        "poolId": candidate.pool_id,
        "score": round(candidate.score, 4),
        "components": [component_document(c) for c in candidate.components],
    }


def rejection_document(rejection: Rejection) -> PlacementRejection:
    """Build a rejected pool's document ``{"poolId", "reasons"}``."""
    return {"poolId": rejection.pool_id, "reasons": list(rejection.reasons)}


def _victim_document(victim: Victim) -> PreemptionVictim:
    return {
        "taskId": victim.task_id,
        "priority": victim.priority,
        "members": [{"poolId": p, "count": c} for p, c in victim.members],
    }


def preemption_document(preemption: Preemption) -> PreemptionPreview:
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


def preview_document(
    result: Result, preemption: Preemption | None = None
) -> PlacementPreview:
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


# --- the queue -------------------------------------------------------------------------------

@with_config(ConfigDict(
    extra="forbid",
    json_schema_extra={
        "examples": [
            {
                "position": 13,
                "competing": 40,
                "exact": True,
                "policy": "fifo",
                "estimatedStartAt": "2026-12-01T12:03:15Z",
                "estimate": "about 3 minutes: the planner places it on pool pool-7 once the "
                "13 oldest live leases on its 3 candidate pools have ended, after the 12 "
                "tasks ahead of it; leases on its 3 candidate pools completed at 4.0 per "
                "minute over the last 15 minutes, one about every 15 seconds",
            }
        ]
    },
))
class TaskQueue(TypedDict):
    """Where an admitted task stands under the active policy, and when it may start."""

    position: Annotated[int | None, Field(
        ge=1, description="1 + the competing tasks ahead under the policy; null when the "
        "task competes for no capacity (no pool can take it until one is added, activated "
        "or changed, or it can never fit: `estimate` says which)."
    )]
    competing: Annotated[int, Field(
        ge=0, description="Waiting tasks of the runtime class that released capacity could help."
    )]
    exact: Annotated[
        bool, Field(description="False: a count reached the read bound (lower bounds).")
    ]
    policy: Annotated[str, Field(description="The policy the position is counted under.")]
    estimatedStartAt: Annotated[datetime | None, Field(
        description="When the scheduler's planner would place it: at the next pass when it "
        "fits now, else once enough live leases have ended (oldest first, spaced at the "
        "observed completion rate); null when it cannot tell (`estimate` says why)."
    )]
    estimate: Annotated[str, Field(description="How the estimate was made, or why there is none.")]


def queue_document(
    *, position: int | None, competing: int, exact: bool, policy: str,
    estimated_start_at: datetime | None = None, estimate: str = "",
) -> TaskQueue:
    """Build the ``queue`` document of an admitted task (its ETA filled in by the caller)."""
    return {"position": position, "competing": competing, "exact": exact, "policy": policy,
            "estimatedStartAt": estimated_start_at, "estimate": estimate}


def duration_words(seconds: float) -> str:
    """Return a rounded duration in words ("40 seconds", "3 minutes", "2.5 hours")."""
    if seconds < 90:
        return f"{max(1, round(seconds))} seconds"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} minutes"
    return f"{seconds / 3600:.1f} hours"


def plural_words(n: int, one: str, many: str) -> str:
    """Return ``n`` with the word for one or many ("1 task", "3 tasks")."""
    return f"{n} {one if n == 1 else many}"


def _oldest(n: int, leases_on: str) -> str:
    """Return "the oldest live lease <on> has" or "the <n> oldest live leases <on> have"."""
    return (f"the oldest live lease {leases_on} has" if n == 1
            else f"the {n} oldest live leases {leases_on} have")


def queue_eta(
    ended: int | None, *, pool: str | None, placed_ahead: int, reason: Mapping[str, Any] | None,
    now: datetime, leases_on: str, completed: int, window_seconds: float, pass_seconds: float,
    leases: int, leases_max: int, setting: str,
) -> tuple[datetime | None, str]:
    """Return the estimated start and its explanation of a planner's forecast: placed on
    ``pool`` (``placed_ahead`` tasks placed before it) once ``ended`` leases ended (None:
    not placed, for ``reason``).

    ``leases`` live leases ``leases_on`` (words: "on its 3 candidate pools") were let end,
    the most ``leases_max`` (the setting named ``setting``); ``completed`` leases there ended
    over the last ``window_seconds``, the rate they are spaced at.
    """
    ahead = plural_words(placed_ahead, "task", "tasks")
    over = f"over the last {duration_words(window_seconds)}"
    if ended == 0:
        return now + timedelta(seconds=pass_seconds), (
            f"at the next pass (passes run at least every {duration_words(pass_seconds)}): "
            f"the planner places it on pool {pool} now, after the {ahead} ahead of it")
    if ended is None:
        if leases >= leases_max:
            return None, (
                f"no estimate: the planner does not place it even once "
                f"{_oldest(leases, leases_on)} ended (the most an estimate lets end, "
                f"{setting})")
        message = (reason or {}).get("message") or "no reason given"
        return None, (
            f"no estimate: the planner does not place it even once every live lease "
            f"{leases_on} has ended ({plural_words(leases, 'lease', 'leases')}): {message}")
    words = _oldest(ended, leases_on)
    if completed == 0:
        return None, (
            f"no estimate: the planner places it on pool {pool} once {words} ended, but no "
            f"lease {leases_on} completed {over}")
    rate = completed / window_seconds
    wait = ended / rate
    return now + timedelta(seconds=wait), (
        f"about {duration_words(wait)}: the planner places it on pool {pool} once {words} "
        f"ended, after the {ahead} ahead of it; leases "
        f"{leases_on} completed at {rate * 60:.1f} per minute {over}, one about every "
        f"{duration_words(1 / rate)}")


@with_config(ConfigDict(extra="forbid"))
class QueueItem(TypedDict):
    """Waiting tasks of one runtime class pending for one reason code."""

    runtimeClass: str
    code: Annotated[str, Field(
        description="The pending reason's code (closest miss), `unexamined` before the first "
        "pass, or `reservation_conflict` after lost races."
    )]
    pending: Annotated[int, Field(ge=0, description="Waiting tasks (ADMITTED or CLAIMED).")]
    parked: Annotated[
        int, Field(ge=0, description="Of those, parked until a wakeup could help them.")
    ]


@with_config(ConfigDict(extra="forbid"))
class QueueSummary(TypedDict):
    """What is pending for the caller, by reason code and runtime class."""

    pending: Annotated[int, Field(ge=0)]
    parked: Annotated[int, Field(ge=0)]
    byReason: dict[str, int]
    byRuntimeClass: dict[str, int]
    items: list[QueueItem]
    oldestPendingAt: Annotated[datetime | None, Field(
        description="Admission time of the oldest waiting task in scope."
    )]
    oldestPendingSeconds: Annotated[
        float | None, Field(description="Its age now, in seconds.")
    ]


def queue_summary_document(
    rows: Sequence[tuple[str, str, int, int, datetime]], *, at: datetime
) -> QueueSummary:
    """Build what is pending from ``(runtime class, code, pending, parked, oldest admission)``
    rows, with the oldest's age at ``at``."""
    by_reason: dict[str, int] = {}
    by_class: dict[str, int] = {}
    oldest: datetime | None = None
    for rc, code, n, _, first in rows:
        by_reason[code] = by_reason.get(code, 0) + n
        by_class[rc] = by_class.get(rc, 0) + n
        oldest = first if oldest is None or first < oldest else oldest
    return {
        "pending": sum(r[2] for r in rows),
        "parked": sum(r[3] for r in rows),
        "byReason": by_reason,
        "byRuntimeClass": by_class,
        "items": [
            {"runtimeClass": rc, "code": code, "pending": n, "parked": parked}
            for rc, code, n, parked, _ in rows
        ],
        "oldestPendingAt": oldest,
        "oldestPendingSeconds": None if oldest is None
        else round(max((at - oldest).total_seconds(), 0.0), 3),
    }
