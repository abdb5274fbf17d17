"""Filter: when the spec lists allowed regions, the pool's region must be one of them."""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import PLACEMENT_CLASS, FilterPlugin, codes_where
from app.scheduling.reasons import CODE, Reason

NAME = names.REGION
REASONS = (Reason.REGION_NOT_ALLOWED,)


class Region(FilterPlugin):
    """Reject pools outside the spec's allowed regions."""

    NAME = NAME
    REASONS = REASONS
    SCOPE = PLACEMENT_CLASS

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return ``region_not_allowed`` for pools in a region the spec does not allow."""
        regions = cycle.spec.regions
        if regions is None:
            return None
        snap = cycle.snapshot
        allowed = np.zeros(len(snap.region_table) + 1, dtype=bool)
        for r in regions:
            code = snap.region_table.get(r)
            if code is not None:
                allowed[code] = True
        return codes_where(~allowed[snap.region[idx]], CODE[Reason.REGION_NOT_ALLOWED])
