"""Base classes of filter and score plugins: the vectorized method each plugin writes, the
single-pool forms derived from it, and the scope that says what a plugin's verdict reads.

The scope lets the pipeline compute a verdict once for every task that shares what it reads
(the PreFilter state of :mod:`app.scheduling.prefilter`):

* :data:`AUDIENCE`: the tenant's audience (the tenants that see the same pools), the spec's
  runtime class and the pools' static columns and health;
* :data:`PLACEMENT_CLASS`: also the rest of the spec's placement class (allowed regions, data
  residency, pool selector, artifact region);
* :data:`TASK` (the default): anything, including usage, this pass's assumed placements and
  the spec's affinity terms and labels. A plugin that does not say otherwise is evaluated for
  every task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
from mypy_extensions import mypyc_attr

from app.scheduling.cycle import Cycle
from app.scheduling.reasons import PASS, Reason, Status

__all__ = [
    "AUDIENCE", "PLACEMENT_CLASS", "TASK", "FilterPlugin", "ScorePlugin", "codes_where", "minmax"
]

#: What a plugin's verdict reads (see the module documentation), narrowest first.
AUDIENCE = "audience"
PLACEMENT_CLASS = "placement_class"
TASK = "task"


def codes_where(fail: np.ndarray, code: int) -> np.ndarray | None:
    """Return a code array with ``code`` where ``fail`` is true, or None when nothing fails."""
    if not fail.any():
        return None
    return np.where(fail, np.int16(code), np.int16(PASS))


@mypyc_attr(allow_interpreted_subclasses=True)
class FilterPlugin(ABC):
    """A filter: per pool, feasible or one reason code; it never raises."""

    NAME: ClassVar[str]
    #: Every reason code the filter may return (metrics label its rejections with ``NAME``).
    REASONS: ClassVar[tuple[Reason, ...]]
    #: What the verdict reads: :data:`AUDIENCE`, :data:`PLACEMENT_CLASS` or :data:`TASK`.
    SCOPE: ClassVar[str] = TASK

    @abstractmethod
    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return int16 codes (PASS or a reason index) for the pools at ``idx``; None: all pass."""

    def filter(self, cycle: Cycle, pool: int) -> Status:
        """Return the status of the pool at snapshot index ``pool``."""
        codes = self.filter_many(cycle, np.array([pool], dtype=np.intp))
        return Status.success() if codes is None else Status.from_code(int(codes[0]))


@mypyc_attr(allow_interpreted_subclasses=True)
class ScorePlugin(ABC):
    """A scorer: per feasible pool a raw score, normalized to 0..100 (higher is better)."""

    NAME: ClassVar[str]
    #: What ``applies`` and the normalized scores read: :data:`PLACEMENT_CLASS` (the spec's
    #: placement class and the pools' static columns) or :data:`TASK`.
    SCOPE: ClassVar[str] = TASK

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
        return raw.astype(np.float64)
    # The extremes by position (argmin/argmax cost a fraction of a ufunc reduction).
    at_lo = raw.argmin()
    at_hi = raw.argmax()
    lo = raw.item(at_lo)
    hi = raw.item(at_hi)
    if hi <= lo:
        return np.full(len(raw), flat)
    # Never below 0 (each difference is >= 0); rounding can land a hair above 100, and only
    # at the best value's position (the scaling is monotonic).
    scaled = (raw - lo if higher_is_better else hi - raw) * (100.0 / (hi - lo))
    if scaled.item(at_hi if higher_is_better else at_lo) <= 100.0:
        return scaled
    return np.minimum(scaled, 100.0, out=scaled)
