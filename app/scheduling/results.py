"""What ``select`` returns: the placement or why there is none, the ranked candidates and the
rejected pools.

These are plain data. The documents stored and served for them are built in one
place, :mod:`app.scheduling.explain`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar, overload

import numpy as np

from app.scheduling.reasons import REASONS, Reason

__all__ = [
    "Built",
    "Candidate",
    "NoPlacement",
    "Placement",
    "Ranked",
    "Rejection",
    "Rejections",
    "Result",
    "ScoreComponent",
    "rejections_by_code",
]

T = TypeVar("T")


class Built(Sequence[T]):
    """A sequence of ``n`` items, each built from its position when first read.

    An explained decision over thousands of pools ranks every candidate and lists every
    rejected pool, and a preview reads one page of them: the rest are counted, never built.
    It equals (and hashes as) the tuple of its items.
    """

    __slots__ = ("_n", "_build", "_built")

    def __init__(self, n: int, build: Callable[[int], T]) -> None:
        self._n = n
        self._build = build
        self._built: dict[int, T] = {}

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, k: int) -> T: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[T, ...]: ...

    def __getitem__(self, k: int | slice) -> T | tuple[T, ...]:
        if isinstance(k, slice):
            return tuple(self[i] for i in range(*k.indices(self._n)))
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError(k)
        item = self._built.get(k)
        if item is None:
            item = self._built[k] = self._build(k)
        return item

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


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


class Rejections(Built["Rejection"]):
    """The rejected pools of an explained decision, each with its one reason code: pool
    ``ids[rows[k]]`` failed with code ``codes[k]`` (an index into ``REASONS``)."""

    __slots__ = ("ids", "rows", "codes")

    def __init__(self, ids: Sequence[str], rows: np.ndarray, codes: np.ndarray) -> None:
        # Not a bound method of its own: the sequence and its builder would be a cycle.
        super().__init__(len(rows), partial(_rejection_at, ids, rows, codes))
        self.ids = ids
        self.rows = rows
        self.codes = codes


def _rejection_at(ids: Sequence[str], rows: np.ndarray, codes: np.ndarray, k: int
                  ) -> Rejection:
    return Rejection(ids[int(rows[k])], (str(REASONS[int(codes[k])]),))


def rejections_by_code(
    rejected: Sequence[Rejection], named: int
) -> list[tuple[str, int, list[str]]]:
    """Return ``(code, count, the first named pool ids)`` of ``rejected``, the most common
    code first (ties by code)."""
    counts: dict[str, int] = {}
    ids: dict[str, list[str]] = {}
    if isinstance(rejected, Rejections):
        codes, first = np.unique(rejected.codes, return_counts=True)
        for code, n in zip(codes.tolist(), first.tolist(), strict=True):
            name = str(REASONS[code])
            counts[name] = n
            rows = rejected.rows[rejected.codes == code][:named].tolist()
            ids[name] = [rejected.ids[r] for r in rows]
    else:
        for rejection in rejected:
            for name in rejection.reasons:
                counts[name] = counts.get(name, 0) + 1
                listed = ids.setdefault(name, [])
                if len(listed) < named:
                    listed.append(rejection.pool_id)
    return [(name, n, ids[name])
            for name, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


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
    candidates: Sequence[Candidate] = ()
    rejected: Sequence[Rejection] = ()
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
    def candidates(self) -> Sequence[Candidate]:
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

