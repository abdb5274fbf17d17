"""Base classes of filter and score plugins: the vectorized method each plugin writes, and
the single-pool forms derived from it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.reasons import PASS, Reason, Status

__all__ = ["FilterPlugin", "ScorePlugin", "codes_where", "minmax"]


def codes_where(fail: np.ndarray, code: int) -> np.ndarray | None:
    """Return a code array with ``code`` where ``fail`` is true, or None when nothing fails."""
    if not fail.any():
        return None
    return np.where(fail, np.int16(code), np.int16(PASS))


class FilterPlugin(ABC):
    """A filter: per pool, feasible or one reason code; it never raises."""

    NAME: ClassVar[str]
    #: Every reason code the filter may return (metrics label its rejections with ``NAME``).
    REASONS: ClassVar[tuple[Reason, ...]]
    #: True when the verdict depends only on the tenant and runtime class of the spec, so the
    #: framework may memoize it per snapshot.
    STATIC: ClassVar[bool] = False

    @abstractmethod
    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return int16 codes (PASS or a reason index) for the pools at ``idx``; None: all pass."""

    def filter(self, cycle: Cycle, pool: int) -> Status:
        """Return the status of the pool at snapshot index ``pool``."""
        codes = self.filter_many(cycle, np.array([pool], dtype=np.intp))
        return Status.success() if codes is None else Status.from_code(int(codes[0]))


class ScorePlugin(ABC):
    """A scorer: per feasible pool a raw score, normalized to 0..100 (higher is better)."""

    NAME: ClassVar[str]

    def applies(self, cycle: Cycle) -> bool:
        """Return whether this plugin has anything to say about the spec."""
        return True

    @abstractmethod
    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return raw float scores for the feasible pools at ``idx``."""

    def normalize(self, cycle: Cycle, raw: np.ndarray) -> np.ndarray:
        """Return the raw scores mapped to 0..100 across the feasible set (default: as is)."""
        return raw

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return a short human reason for ``value`` on the pool at snapshot index ``pool``."""
        return f"{self.NAME} {value:.1f}"


def minmax(raw: np.ndarray, *, higher_is_better: bool, flat: float = 100.0) -> np.ndarray:
    """Return ``raw`` rescaled to 0..100 over its range; ``flat`` when all values are equal."""
    if len(raw) == 0:
        return raw
    # The ufuncs' own reductions: ndarray.min/max add a Python-level wrapper per call.
    lo = np.minimum.reduce(raw)
    hi = np.maximum.reduce(raw)
    if hi <= lo:
        return np.full(len(raw), flat)
    scaled = (raw - lo if higher_is_better else hi - raw) * (100.0 / (hi - lo))
    # Rounding can land a hair outside the range (100/3 * 3 > 100); scores are 0..100 exactly.
    return np.minimum(np.maximum(scaled, 0.0, out=scaled), 100.0, out=scaled)
