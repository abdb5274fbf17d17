"""Score: cheaper pools (lower ``costWeight``) first, normalized over the feasible set."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import PLACEMENT_CLASS, ScorePlugin, minmax

NAME = names.COST


class Cost(ScorePlugin):
    """Prefer the cheapest feasible pools: 100 for the cheapest, 0 for the dearest."""

    NAME = NAME
    SCOPE = PLACEMENT_CLASS

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return each pool's cost weight (lower is better)."""
        return cycle.snapshot.cost[idx]

    def normalize(self, cycle: Cycle, raw: np.ndarray) -> np.ndarray:
        """Map the cheapest feasible pool to 100 and the dearest to 0 (all equal: 100)."""
        return minmax(raw, higher_is_better=False)

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return the pool's cost weight."""
        return self.reason(cycle.snapshot.cost.item(pool))

    @staticmethod
    @lru_cache(maxsize=4096)
    def reason(weight: float) -> str:
        """Return the reason of a pool with this cost weight."""
        return f"cost weight {weight:g}; cheaper pools score higher"
