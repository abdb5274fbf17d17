"""What ``select`` returns: the placement or why there is none, the ranked candidates and the
rejected pools.

These are plain data. The documents stored and served for them are built in one
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
    "Ranked",
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

    @property
    def members(self) -> tuple[tuple[str, int], ...] | None:
        """Return every member's pool of the placement, or None when there is none."""
        return None if self.placement is None else self.placement.members


class Ranked:
    """A single-member placement as plain values: the best ``top_k`` pools, their totals,
    and the placement's components as ``(name, value, reason)`` tuples.

    The reconciler decides most tasks this way and needs of a decision only its members, its
    rejection counts and its stored document (:func:`app.scheduling.explain.ranked_document`),
    so no dataclass is built per candidate and component.
    It reads like the :class:`Result` it stands for (``members``, ``rejection_counts``,
    ``reason``, and ``placement`` and ``candidates`` built on first use), and :meth:`result`
    is that result, equal to the full select's.
    """

    __slots__ = ("pool_ids", "scores", "components", "top_k", "rejection_counts", "members",
                 "_result")

    #: A placement has no pending reason.
    reason: NoPlacement | None = None

    def __init__(
        self,
        pool_ids: list[str],
        scores: list[float],
        components: tuple[tuple[str, float, str], ...],
        top_k: int,
        rejection_counts: Mapping[Reason, int],
    ) -> None:
        self.pool_ids = pool_ids
        self.scores = scores
        self.components = components
        self.top_k = top_k
        self.rejection_counts = rejection_counts
        self.members = ((pool_ids[0], 1),)
        self._result: Result | None = None

    @property
    def placement(self) -> Placement:
        """Return the placement as the full select returns it."""
        placement = self.result().placement
        assert placement is not None
        return placement

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        """Return the ranked candidates as the full select returns them (the walk reads them
        after a lost race)."""
        return self.result().candidates

    def result(self) -> Result:
        """Return the decision as the :class:`Result` the full select returns."""
        if self._result is None:
            components = tuple(ScoreComponent(*c) for c in self.components)
            best = Candidate(self.pool_ids[0], self.scores[0], components)
            rest = [Candidate(p, s) for p, s in zip(self.pool_ids[1:], self.scores[1:],
                                                     strict=True)]
            placement = Placement(best.pool_id, best.score, components, self.members,
                                  tuple(rest[: max(self.top_k - 1, 0)]))
            self._result = Result(placement, candidates=(best, *rest),
                                  rejection_counts=self.rejection_counts)
        return self._result

