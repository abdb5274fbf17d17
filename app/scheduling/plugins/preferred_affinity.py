"""Score: preferred affinity terms, summed by weight and normalized over the feasible set.

A term counts on a pool when a matching placement of the tenant (actual or assumed) is in the
pool's topology domain: a positive term adds its weight, an anti term subtracts it. Preferred
terms only score; they never make a feasible pool infeasible.
"""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import ScorePlugin, minmax

NAME = names.PREFERRED_AFFINITY


class PreferredAffinity(ScorePlugin):
    """Prefer pools near the tasks the spec likes and away from those it avoids."""

    NAME = NAME

    def applies(self, cycle: Cycle) -> bool:
        """Return whether the spec has preferred terms."""
        return bool(cycle.spec.preferred)

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return the signed sum of the weights of the terms each pool matches."""
        raw = np.zeros(len(idx), dtype=np.float64)
        for term in cycle.spec.preferred:
            counts, _ = cycle.term_counts_at(term, idx)
            hit = counts > 0
            raw += np.where(hit, -term.weight if term.anti else term.weight, 0)
        cycle.notes[NAME] = (idx, raw)
        return raw

    def normalize(self, cycle: Cycle, raw: np.ndarray) -> np.ndarray:
        """Map the best sum to 100 and the worst to 0; all equal: 100 if positive, else 0."""
        flat = 100.0 if len(raw) and raw[0] > 0 else 0.0
        return minmax(raw, higher_is_better=True, flat=flat)

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return the signed sum of matched term weights (as this cycle's scoring summed it)."""
        raw = cycle.noted(NAME, pool)
        if raw is not None:
            return self.reason(raw)
        return self.reason(self.score_many(cycle, np.array([pool], dtype=np.intp)).item(0))

    def reason(self, raw: float) -> str:
        """Return the reason of a pool whose matched terms sum to ``raw`` (a raw score)."""
        return f"preferred terms matched for {raw:+g} of weight"
