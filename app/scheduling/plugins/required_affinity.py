"""Filter: required affinity and anti-affinity terms against actual and assumed placements.

A positive term is satisfied on a pool when a matching task of the same tenant is placed in
the pool's topology domain. Bootstrap: when no matching placement exists anywhere
and the task's own labels match the selector, the task itself seeds the cohort and the term
is satisfied everywhere. Two tasks that each require only the other's labels never seed each
other. An anti term is violated on a pool whose domain holds a matching placement.
"""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.base import FilterPlugin
from app.scheduling.reasons import CODE, PASS, Reason

NAME = names.REQUIRED_AFFINITY
REASONS = (Reason.AFFINITY_UNSATISFIED, Reason.ANTI_AFFINITY_VIOLATED)


class RequiredAffinity(FilterPlugin):
    """Reject pools that break a required term, checking terms in spec order."""

    NAME = NAME
    REASONS = REASONS

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        """Return the first broken term's code per pool."""
        terms = cycle.spec.required
        if not terms:
            return None
        codes = None
        for term in terms:
            counts, total = cycle.term_counts_at(term, idx)
            if term.anti:
                bad = counts > 0
                code = CODE[Reason.ANTI_AFFINITY_VIOLATED]
            elif total == 0 and term.matches(cycle.spec.labels):
                continue  # bootstrap: the task seeds its own cohort
            else:
                bad = counts == 0
                code = CODE[Reason.AFFINITY_UNSATISFIED]
            if not bad.any():
                continue
            if codes is None:
                codes = np.full(len(idx), PASS, dtype=np.int16)
            codes[bad & (codes == PASS)] = code
        return codes
