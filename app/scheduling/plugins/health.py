"""Filter: the pool must be ready, its runtime heartbeat fresh, and its ledger registered.

Each check fails closed: a runtime that never sent a heartbeat is unhealthy, and a pool whose
ledger was never registered is never treated as idle.
"""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import AUDIENCE, FilterPlugin
from app.scheduling.reasons import CODE, PASS, Reason

NAME = names.HEALTH
REASONS = (Reason.POOL_NOT_READY, Reason.RUNTIME_UNHEALTHY, Reason.LEDGER_MISSING)


class Health(FilterPlugin):
    """Reject pools that are not ready, not heartbeating, or without a ledger."""

    NAME = NAME
    REASONS = REASONS
    SCOPE = AUDIENCE

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return the first failing check's code per pool: ready, heartbeat, ledger."""
        snap = cycle.snapshot
        ready = snap.ready[idx]
        fresh = snap.fresh[idx]
        ledger = snap.has_ledger[idx]
        if ready.all() and fresh.all() and ledger.all():
            return None
        codes = np.full(len(idx), PASS, dtype=np.int16)
        # Assign in reverse order so that the first failing check wins.
        codes[~ledger] = CODE[Reason.LEDGER_MISSING]
        codes[~fresh] = CODE[Reason.RUNTIME_UNHEALTHY]
        codes[~ready] = CODE[Reason.POOL_NOT_READY]
        return codes
