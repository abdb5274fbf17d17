"""Filter: the pool's labels must contain every key/value of the spec's pool selector."""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import PLACEMENT_CLASS, FilterPlugin, codes_where
from app.scheduling.reasons import CODE, Reason

NAME = names.POOL_SELECTOR
REASONS = (Reason.SELECTOR_MISMATCH,)


class PoolSelector(FilterPlugin):
    """Reject pools whose labels do not match the pool selector."""

    NAME = NAME
    REASONS = REASONS
    SCOPE = PLACEMENT_CLASS

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return ``selector_mismatch`` for pools missing a selector label."""
        selector = cycle.spec.pool_selector
        if not selector:
            return None
        mask = cycle.snapshot.selector_mask(selector)
        return codes_where(~mask[idx], CODE[Reason.SELECTOR_MISMATCH])
