"""Score: projected utilization after placing one member — least loaded (spread) or most
loaded (binpack) first.

Utilization per dimension is (reserved + assumed + request) / capacity over the dimensions
the pool offers. The score compares the dominant (largest) utilization first and the mean
utilization second: ``u = dominant + mean / 1000``, so the mean only separates pools of equal
dominant utilization. Spread scores ``100 * (1 - u / 1.001)``, binpack ``100 * u / 1.001``;
both are absolute (not normalized) so that a score reads the same across tasks.
"""

from __future__ import annotations

from abc import abstractmethod
from functools import lru_cache
from typing import ClassVar, cast

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import ScorePlugin

NAME = names.LEAST_LOADED
#: Maps ``u`` in 0..1.001 onto 0..100.
_SCALE = 100.0 / 1.001
# The constants of the scores as 0-d float64 arrays: the same values and the same float64
# arithmetic as the Python floats, without numpy converting a Python scalar at every operation
# (a fifth of a microsecond each at 1,000 pools).
_TOP = np.array(1.001)
_MEAN_WEIGHT = np.array(1000.0)
_SCALE_ARRAY = np.array(_SCALE)
#: ``len(layout)`` as a 0-d float64 array, by the number of dimensions offered.
_DIMS = (np.array(1.0), np.array(1.0), np.array(2.0), np.array(3.0))


@lru_cache(maxsize=65536)
def _percent_text(dominant: int, mean: int, tail: str) -> str:
    return f"projected utilization {dominant}% dominant, {mean}% mean; {tail}"


def _utilization_text(dominant: float, mean: float, tail: str) -> str:
    """Return ``f"projected utilization {dominant:.0%} dominant, {mean:.0%} mean; {tail}"``.

    ``format(x, ".0%")`` is ``x * 100.0`` rounded to an integer, ties to even, which is what
    ``round`` returns; so for utilizations in (0, 1] (nearly every pool that fits) the text
    is the one of the whole percents (0 is left out: ``-0.0`` formats as ``-0%``).
    """
    if 0.0 < dominant <= 1.0 and 0.0 < mean <= 1.0:
        return _percent_text(round(dominant * 100.0), round(mean * 100.0), tail)
    return f"projected utilization {dominant:.0%} dominant, {mean:.0%} mean; {tail}"


def _clip100(x: np.ndarray) -> np.ndarray:
    """Clip ``x`` to 0..100 in place (left as is when its extremes are within)."""
    if x.item(x.argmin()) >= 0.0 and x.item(x.argmax()) <= 100.0:
        return x
    return np.minimum(np.maximum(x, 0.0, out=x), 100.0, out=x)


def projected_utilization(cycle: Cycle, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (dominant, mean) projected utilization in 0..1 for the pools at ``idx``."""
    cap, need = cycle.capacity_and_need(idx)
    layout = cycle.class_memo(idx, NAME, capacity_layout, cap, narrow=_layout_narrowed)
    return utilization(need, cap, layout)


def capacity_layout(cap: np.ndarray) -> tuple[tuple[int, np.ndarray], ...] | None:
    """Return, when every pool offers the same dimensions (at least one), each of them with
    its capacities as floats; else None (PreScore state of the pools' capacity rows)."""
    offered = cap > 0
    # A 2-D array reduced along one axis is an array (numpy's stubs also allow a scalar).
    everywhere = cast(np.ndarray, offered.all(axis=0))
    if not everywhere.any() or not (everywhere == offered.any(axis=0)).all():
        return None
    return tuple(
        (d, np.ascontiguousarray(cap[:, d], dtype=np.float64)) for d in range(3) if everywhere[d]
    )


def _layout_narrowed(
    layout: tuple[tuple[int, np.ndarray], ...] | None, positions: np.ndarray
) -> tuple[tuple[int, np.ndarray], ...] | None:
    """Return :func:`capacity_layout` of the pools at ``positions`` of a layout's pools (None
    when theirs is: the columns of a subset would be the same values, only slower)."""
    return None if layout is None else tuple((d, c.take(positions)) for d, c in layout)


def utilization(
    need: np.ndarray, cap: np.ndarray, layout: tuple[tuple[int, np.ndarray], ...] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return per row the largest and the mean of ``clip(need / cap, 0, 1)`` over the
    dimensions the pool offers (capacity above zero; at least one counts).

    The mean adds the columns left to right (a dimension not offered adds nothing).
    ``layout`` (:func:`capacity_layout` of ``cap``) computes the same values column by
    column when no utilization needs the clip.
    """
    if layout is not None and need.item(need.argmin()) >= 0:
        columns = need.T
        (d, c), *others = layout
        dominant = total = columns[d] / c
        for d, c in others:
            u = columns[d] / c
            dominant = np.maximum(dominant, u)
            total = total + u
        if dominant.item(dominant.argmax()) <= 1.0:
            return dominant, np.true_divide(total, _DIMS[len(layout)])
    offered = cap > 0
    util = np.divide(need, cap, out=np.zeros(cap.shape, dtype=np.float64), where=offered)
    np.minimum(np.maximum(util, 0.0, out=util), 1.0, out=util)
    o0, o1, o2 = offered.T.view(np.int8)
    u0, u1, u2 = util.T
    return np.maximum(np.maximum(u0, u1), u2), (u0 + u1 + u2) / np.maximum(o0 + o1 + o2, 1)


def projected_utilization_at(cycle: Cycle, pool: int) -> tuple[float, float]:
    """Return (dominant, mean) projected utilization of the pool at snapshot index ``pool``:
    what this cycle's scoring computed when it covered the pool, else computed for it."""
    note = cycle.notes.get(NAME)
    if note is not None:
        idx, dominant, mean = note
        pos = cycle.position(idx, pool)
        if pos is not None:
            return dominant.item(pos), mean.item(pos)
    dominant, mean = projected_utilization(cycle, np.array([pool], dtype=np.intp))
    return dominant.item(0), mean.item(0)


class _Load(ScorePlugin):
    """A score of the projected utilization (the two strategies differ in its direction)."""

    #: How the reason reads the utilization.
    TAIL: ClassVar[str]

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return the scores of :meth:`from_utilization`, noting the utilization for
        ``describe``."""
        dominant, mean = projected_utilization(cycle, idx)
        cycle.notes[NAME] = (idx, dominant, mean)
        return self.from_utilization(dominant, mean)

    @abstractmethod
    def from_utilization(self, dominant: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """Return the scores of pools with these projected utilizations."""

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return the projected utilization that produced ``value``."""
        dominant, mean = projected_utilization_at(cycle, pool)
        return _utilization_text(dominant, mean, self.TAIL)

    def reason(self, dominant: float, mean: float) -> str:
        """Return the reason of a pool with this projected utilization."""
        return _utilization_text(dominant, mean, self.TAIL)


class LeastLoaded(_Load):
    """Prefer pools whose projected utilization is lowest (the spread strategy)."""

    NAME = NAME
    TAIL = "lower is better"

    def from_utilization(self, dominant: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """Return the scores of pools with these projected utilizations."""
        score = np.subtract(_TOP, dominant)
        score -= np.true_divide(mean, _MEAN_WEIGHT)
        score *= _SCALE_ARRAY
        return _clip100(score)


class MostLoaded(_Load):
    """Prefer pools whose projected utilization is highest (the binpack strategy)."""

    NAME = names.MOST_LOADED
    TAIL = "higher packs"

    def from_utilization(self, dominant: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """Return the scores of pools with these projected utilizations."""
        score = np.true_divide(mean, _MEAN_WEIGHT)
        score += dominant
        score *= _SCALE_ARRAY
        return _clip100(score)
