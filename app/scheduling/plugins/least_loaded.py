"""Score: projected utilization after placing one member — least loaded (spread) or most
loaded (binpack) first.

Utilization per dimension is (reserved + assumed + request) / capacity over the dimensions
the pool offers. The score compares the dominant (largest) utilization first and the mean
utilization second: ``u = dominant + mean / 1000``, so the mean only separates pools of equal
dominant utilization. Spread scores ``100 * (1 - u / 1.001)``, binpack ``100 * u / 1.001``;
both are absolute (not normalized) so that a score reads the same across tasks.
"""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import ScorePlugin

NAME = names.LEAST_LOADED
_SCALE = 100.0 / 1.001
#: The reasons rendered so far, by plugin tail and whole percents (dominant, mean).
_TEXTS: dict[tuple[str, int, int], str] = {}


def _utilization_text(dominant: float, mean: float, tail: str) -> str:
    """Return ``f"projected utilization {dominant:.0%} dominant, {mean:.0%} mean; {tail}"``,
    memoized by whole percents for utilizations in (0, 1] (nearly every pool that fits).

    ``format(x, ".0%")`` is ``format(x * 100.0, ".0f") + "%"``: ``x * 100.0`` correctly
    rounded to an integer, ties to even, which is what ``round`` returns; so the key names the
    text exactly (0 is left out: ``-0.0`` formats as ``-0%``; such values are formatted).
    """
    if 0.0 < dominant <= 1.0 and 0.0 < mean <= 1.0:
        key = (tail, round(dominant * 100.0), round(mean * 100.0))
        text = _TEXTS.get(key)
        if text is None:
            if len(_TEXTS) >= 65536:
                _TEXTS.clear()
            text = _TEXTS[key] = f"projected utilization {key[1]}% dominant, {key[2]}% mean; {tail}"
        return text
    return f"projected utilization {dominant:.0%} dominant, {mean:.0%} mean; {tail}"


def _clip100(x: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, 0.0, out=x), 100.0, out=x)


def projected_utilization(cycle: Cycle, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (dominant, mean) projected utilization in 0..1 for the pools at ``idx``."""
    cap = cycle.snapshot.cap.take(idx, axis=0)
    used = cycle.used(idx) + cycle.req
    offered = cap > 0
    util = np.divide(used, cap, out=np.zeros(cap.shape, dtype=np.float64), where=offered)
    np.minimum(np.maximum(util, 0.0, out=util), 1.0, out=util)
    return dominant_and_mean(util, offered)


def dominant_and_mean(util: np.ndarray, offered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return per row of ``util`` its largest value and its mean over the ``offered`` columns
    (at least one): ``util.max(axis=1)`` and ``util.sum(axis=1) / offered.sum(axis=1)``, to
    the bit, column by column (the row reductions cost several times more on rows of three;
    the sum adds left to right, as they do)."""
    u0, u1, u2 = util.T
    o0, o1, o2 = offered.T.view(np.int8)
    dims = np.maximum(o0 + o1 + o2, 1)
    return np.maximum(np.maximum(u0, u1), u2), (u0 + u1 + u2) / dims


def _scored(cycle: Cycle, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return :func:`projected_utilization` and note it for ``describe``."""
    dominant, mean = projected_utilization(cycle, idx)
    cycle.notes[NAME] = (idx, dominant, mean)
    return dominant, mean


def projected_utilization_at(cycle: Cycle, pool: int) -> tuple[float, float]:
    """Return (dominant, mean) projected utilization of the pool at snapshot index ``pool``.

    Read back from this cycle's scoring when it covered the pool; else the same arithmetic as
    :func:`projected_utilization` on plain floats (one pool: numpy's overhead would dominate).
    """
    note = cycle.notes.get(NAME)
    if note is not None:
        idx, dominant, mean = note
        pos = int(np.searchsorted(idx, pool))
        if pos < len(idx) and idx[pos] == pool:
            return float(dominant[pos]), float(mean[pos])
    snap = cycle.snapshot
    cap = snap.cap[pool].tolist()
    used = (snap.reserved if cycle.assumed is None else cycle.assumed.used)[pool].tolist()
    util = [
        min(max((u + r) / c, 0.0), 1.0)
        for u, r, c in zip(used, cycle.spec.requests, cap, strict=True)
        if c > 0
    ]
    if not util:
        return 0.0, 0.0
    return max(util), sum(util) / len(util)


class LeastLoaded(ScorePlugin):
    """Prefer pools whose projected utilization is lowest (the spread strategy)."""

    NAME = NAME

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return ``100 * (1 - u)`` scaled so that the result stays within 0..100."""
        return self.from_utilization(*_scored(cycle, idx))

    def from_utilization(self, dominant: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """Return the scores of pools with these projected utilizations."""
        return _clip100((1.001 - dominant - mean / 1000.0) * _SCALE)

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return the projected utilization that produced ``value``."""
        return self.reason(*projected_utilization_at(cycle, pool))

    def reason(self, dominant: float, mean: float) -> str:
        """Return the reason of a pool with this projected utilization."""
        return _utilization_text(dominant, mean, "lower is better")


class MostLoaded(ScorePlugin):
    """Prefer pools whose projected utilization is highest (the binpack strategy)."""

    NAME = names.MOST_LOADED

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return ``100 * u`` scaled so that the result stays within 0..100."""
        return self.from_utilization(*_scored(cycle, idx))

    def from_utilization(self, dominant: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """Return the scores of pools with these projected utilizations."""
        return _clip100((dominant + mean / 1000.0) * _SCALE)

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return the projected utilization that produced ``value``."""
        return self.reason(*projected_utilization_at(cycle, pool))

    def reason(self, dominant: float, mean: float) -> str:
        """Return the reason of a pool with this projected utilization."""
        return _utilization_text(dominant, mean, "higher packs")
