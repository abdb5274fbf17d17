"""Filter: the pool must run the task's runtime class."""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import AUDIENCE, FilterPlugin, codes_where
from app.scheduling.reasons import CODE, Reason

NAME = names.RUNTIME_CLASS
REASONS = (Reason.RUNTIME_CLASS_MISMATCH,)


class RuntimeClass(FilterPlugin):
    """Reject pools of another runtime class."""

    NAME = NAME
    REASONS = REASONS
    SCOPE = AUDIENCE

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return ``runtime_class_mismatch`` for pools of another runtime class."""
        snap = cycle.snapshot
        code = snap.rc_table.get(cycle.spec.runtime_class, -2)
        return codes_where(snap.rc[idx] != code, CODE[Reason.RUNTIME_CLASS_MISMATCH])
