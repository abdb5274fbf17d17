"""Score: spread a tenant's tasks across failure domains.

The fewer of the tenant's placed members (actual and assumed) in a pool's failure domain, the
higher the score; normalized over the feasible set (all equal: 100).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from app.scheduling.cycle import Cycle, tenant_domain_counts
from app.scheduling.plugins import names
from app.scheduling.plugins.base import ScorePlugin, minmax

NAME = names.FAILURE_DOMAIN_SPREAD
_TOPOLOGY = "failureDomain"


class FailureDomainSpread(ScorePlugin):
    """Prefer failure domains holding fewer of the tenant's tasks."""

    NAME = NAME

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        """Return the tenant's member count in each pool's failure domain (lower is better;
        integers)."""
        dom, per_domain = tenant_domain_counts(
            cycle.snapshot, cycle.assumed, cycle.spec.tenant_id, _TOPOLOGY)
        codes = cycle.class_memo(idx, NAME, dom.take, idx, narrow=np.ndarray.take)
        raw = per_domain.take(codes)
        cycle.notes[NAME] = (idx, raw)
        return raw

    def normalize(self, cycle: Cycle, raw: np.ndarray) -> np.ndarray:
        """Map the emptiest domain to 100 and the fullest to 0."""
        return minmax(raw, higher_is_better=False)

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        """Return how many of the tenant's members share the pool's failure domain (as this
        cycle's scoring counted them)."""
        raw = cycle.noted(NAME, pool)
        if raw is not None:
            return self.reason(int(raw))  # the counts scored are integers
        dom, per_domain = cycle.tenant_domain_counts(_TOPOLOGY)
        return self.reason(per_domain.item(dom.item(pool)))

    @staticmethod
    @lru_cache(maxsize=1024)
    def reason(members: int) -> str:
        """Return the reason of a pool whose failure domain holds ``members`` of the tenant's."""
        return f"{members} of the tenant's members in this failure domain"
