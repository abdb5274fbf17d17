"""Filter: the pool must list the task's tenant.

The framework only evaluates pools the tenant can see, so in practice this filter never
rejects; it stays in the pipeline so that a direct evaluation is still safe.
"""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import AUDIENCE, FilterPlugin, codes_where
from app.scheduling.reasons import CODE, Reason

NAME = names.TENANT_ACCESS
REASONS = (Reason.TENANT_NOT_ALLOWED,)


class TenantAccess(FilterPlugin):
    """Reject pools that do not list the tenant."""

    NAME = NAME
    REASONS = REASONS
    SCOPE = AUDIENCE

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return ``tenant_not_allowed`` for pools that do not list the tenant."""
        mask = cycle.snapshot.tenant_mask(cycle.spec.tenant_id)
        return codes_where(~mask[idx], CODE[Reason.TENANT_NOT_ALLOWED])
