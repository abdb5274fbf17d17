"""What ``select`` returns: the placement or why there is none, the ranked candidates and the
rejected pools.

These are plain data. The documents stored and served for them (SPEC §6) are built in one
place, :mod:`app.scheduling.explain`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from app.scheduling.reasons import Reason

__all__ = [
    "Candidate",
    "NoPlacement",
    "Placement",
    "Rejection",
    "Result",
    "ScoreComponent",
]


@dataclass(frozen=True, slots=True)
class ScoreComponent:
    """One score plugin's weighted contribution to a pool's total, with a human reason."""

    name: str
    value: float
    reason: str



@dataclass(frozen=True, slots=True)
class Candidate:
    """A feasible pool with its total score and components."""

    pool_id: str
    score: float
    components: tuple[ScoreComponent, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision: the first member's pool, its score, every member's pool, alternatives."""

    pool_id: str
    score: float
    components: tuple[ScoreComponent, ...]
    members: tuple[tuple[str, int], ...]
    alternatives: tuple[Candidate, ...] = ()



@dataclass(frozen=True, slots=True)
class Rejection:
    """A visible pool that failed a filter, with its reason codes."""

    pool_id: str
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NoPlacement:
    """Why a task fits nowhere: the closest-miss code, a sentence, rejected pools by code, and
    the pools whose released capacity could let it fit (None: more than the core names)."""

    code: Reason
    message: str
    rejections: Mapping[str, int] = field(default_factory=dict)
    wake_pools: tuple[str, ...] | None = ()



@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of ``select``: placement or reason, ranked candidates, rejections."""

    placement: Placement | None
    candidates: tuple[Candidate, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    rejection_counts: Mapping[Reason, int] = field(default_factory=dict)
    reason: NoPlacement | None = None

