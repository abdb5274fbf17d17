"""Filter: when the spec requires a data residency, the pool must have exactly that value."""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import PLACEMENT_CLASS, FilterPlugin, codes_where
from app.scheduling.reasons import CODE, Reason

NAME = names.DATA_RESIDENCY
REASONS = (Reason.RESIDENCY_MISMATCH,)


class DataResidency(FilterPlugin):
    """Reject pools whose data residency differs from the required one."""

    NAME = NAME
    REASONS = REASONS
    SCOPE = PLACEMENT_CLASS

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return ``residency_mismatch`` for pools with another (or no) data residency."""
        wanted = cycle.spec.data_residency
        if wanted is None:
            return None
        snap = cycle.snapshot
        code = snap.residency_table.get(wanted, -2)
        return codes_where(snap.residency[idx] != code, CODE[Reason.RESIDENCY_MISMATCH])
