"""The fair-share reclaim planner: a task whose tenant borrows less than its fair share takes
borrowed capacity back from a tenant above its share.

A task of a managed runtime class that must borrow (its tenant is above its nominal with
it), fits its quota, but finds no pool for capacity is remembered. After the pass's last
decision and after the nominal reclaims (:mod:`.reclaim`, whose book it shares: a victim
tenant's borrowed work is never counted twice), each remembered task, in the pass's order,
asks :func:`~app.scheduling.reclaim.plan_reclaim` with a fairness test
(:func:`~app.scheduling.reclaim.fair_test`): the victims are borrowed leases of the other
tenants of its quota tree whose share is above the reclaimer's share *with* its task, taken
only in sets after which each victim tenant's share is still at least that (the
preemptor's final share is at most the victim's: a victim's requeued task can never reclaim
back, so reclaims do not go back and forth). Everything else is a reclaim's: victims never
pushed below their nominal, the minimum runtime, the grace period, the ``reclaiming``
pending code while it waits. A task the test leaves without victims is handed back as it
was, its message saying it waits for its fair share, with the shares.

A task its quota refuses once the reclaims planned before it in the pass are charged (their
needs count as their tenants' usage from the next pass on) is left as it was.

Outcomes are counted apart from the nominal reclaims: ``unfair`` for a task no fair set
of victims lets fit.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from app.scheduling.displacement import Settling, Step
from app.scheduling.displacement.reclaim import Reclaim
from app.scheduling.reclaim import ReclaimBook, fair_test
from app.scheduling.records import Kind, Unclaim

__all__ = ["FairShareReclaim"]


class FairShareReclaim:
    """Remembers the pass's borrowing tasks that lack capacity, then plans their fair-share
    reclaims with the reclaim planner's book and grant."""

    kind = Kind.FAIR_SHARE

    def __init__(self, reclaim: Reclaim) -> None:
        self._reclaim = reclaim
        self._candidates: list[Step] = []
        #: Tasks that could not reclaim their fair share, by outcome.
        self.outcomes: Counter[str] = Counter()

    def consider(self, step: Step) -> Unclaim | None:
        """Remember a task that fits nowhere for capacity in a managed runtime class."""
        if self._reclaim.wants(step):
            self._candidates.append(step)
        return None

    def settle(self, state: Settling) -> None:
        """Plan the remembered borrowing tasks' fair-share reclaims."""
        if not self._candidates:
            return
        book = self._reclaim.book(state)
        for step in self._candidates:
            spec = step.spec
            if state.unclaims[step.at].task_id != step.task.id or book.within_nominal(
                    spec.tenant_id, spec.runtime_class, spec.total_requests):
                continue  # not a borrowing task: the nominal reclaim's
            if state.holds.grants.get(step.task.id) is not None:
                continue
            quota = self._reclaim.quota
            if quota is not None and quota.refuse(
                    spec.tenant_id, spec.runtime_class, spec.total_requests) is not None:
                continue  # reclaims planned before it took what its quota could borrow
            test = fair_test(book, spec)
            if self._reclaim.plan(state, step, book, test, kind=self.kind) is None:
                self.outcomes["unfair"] += 1
                state.unclaims[step.at] = _waiting_fair(state.unclaims[step.at], book, step)


def _waiting_fair(pending: Unclaim, book: ReclaimBook, step: Step) -> Unclaim:
    """Return ``pending`` with its message saying the task waits for its fair share."""
    doc = pending.pending_reason
    if doc is None:
        return pending
    spec = step.spec
    share = book.share(spec.tenant_id, spec.runtime_class,
                       np.array(spec.total_requests, dtype=np.int64))
    message = (f"{doc.get('message', '')}; waits for its fair share: {spec.tenant_id}'s "
               f"share would be {share:.3f} with this task, and no borrower of its cohort "
               "it could take from is above that")
    return dataclasses.replace(pending, pending_reason={**doc, "message": message,
                                                         "fairShare": round(share, 6)})
