"""Filter: only ACTIVE pools take new placements (CORDONED and DRAINING keep their leases)."""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import AUDIENCE, FilterPlugin, codes_where
from app.scheduling.reasons import CODE, Reason

NAME = names.POOL_STATUS
REASONS = (Reason.POOL_NOT_ACTIVE,)


class PoolStatus(FilterPlugin):
    """Reject pools that are cordoned or draining."""

    NAME = NAME
    REASONS = REASONS
    SCOPE = AUDIENCE

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return ``pool_not_active`` for pools whose status is not ACTIVE."""
        return codes_where(cycle.snapshot.status[idx] != 0, CODE[Reason.POOL_NOT_ACTIVE])
