"""Filter: one member of the task must fit in what is left after actual and assumed usage.

Dimensions are checked in the order cpu, memory, llm slots; the first that lacks wins.
"""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import FilterPlugin
from app.scheduling.reasons import CODE, PASS, Reason

NAME = names.CAPACITY
REASONS = (Reason.INSUFFICIENT_CPU, Reason.INSUFFICIENT_MEMORY, Reason.INSUFFICIENT_LLM_SLOTS)


class Capacity(FilterPlugin):
    """Reject pools without room for one member on some dimension."""

    NAME = NAME
    REASONS = REASONS

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return the first lacking dimension's code per pool."""
        cap, need = cycle.capacity_and_need(idx)
        lack = need > cap
        if not np.count_nonzero(lack):
            return None
        codes = np.full(len(idx), PASS, dtype=np.int16)
        for dim in (2, 1, 0):  # reverse, so that the first lacking dimension wins
            codes[lack[:, dim]] = CODE[REASONS[dim]]
        return codes
