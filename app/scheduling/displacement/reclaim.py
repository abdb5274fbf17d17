"""The reclaim planner: a task within its tenant's nominal takes back borrowed capacity.

A task of a managed runtime class that fits its quota but finds no pool for capacity (and
planned no preemption) is remembered. After the pass's last decision, the remembered tasks
within their tenant's nominal ask :func:`~app.scheduling.reclaim.plan_reclaim`, in the
pass's order, on top of every placement and hold of the pass, for the borrowed leases of
their cohort that would make room. Planned, a reclaim is granted like a preemption and its
task is handed back parked with the pending code ``reclaiming``. Outcomes are counted:
``unavailable`` for a task that could not reclaim (over its nominal, nothing borrowed, no
set of victims).

A reclaimer (or a preemptor) still waiting for its victims keeps its holds only while its
tenant's quota admits it once the leases being revoked have stopped
(:meth:`Reclaim.refused`): one its quota now refuses gives them back in the pass that sees
it, and waits for its quota like any task.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np

from app.scheduling.displacement import Settling, Step
from app.scheduling.explain import reclaiming_document
from app.scheduling.inputs import ReclaimInputs
from app.scheduling.plugins.quota import RESOURCES, QuotaBook, QuotaRow
from app.scheduling.preemption import Preemption, VictimIndex
from app.scheduling.reasons import Reason
from app.scheduling.reclaim import FairTest, ReclaimBook, book_displaced, plan_reclaim
from app.scheduling.records import RECLAIMING, Kind, Unclaim
from app.scheduling.results import NoPlacement
from app.scheduling.spec import CompiledSpec

__all__ = ["Reclaim"]

#: Headlines a reclaim can help: the pools that pass every other filter lack capacity (for
#: a gang, also: some pools fit a member but no plan fits them all).
_CAPACITY = frozenset({Reason.INSUFFICIENT_CPU, Reason.INSUFFICIENT_MEMORY,
                       Reason.INSUFFICIENT_LLM_SLOTS})
_GANG = _CAPACITY | {Reason.GANG_UNSATISFIABLE}


class Reclaim:
    """Remembers the pass's possible reclaimers, then plans their reclaims."""

    kind = Kind.RECLAIM

    def __init__(
        self, inputs: ReclaimInputs, rows: tuple[QuotaRow, ...], cohorts: dict[str, str],
        *, now: datetime, grace_seconds: float, quota: QuotaBook | None,
    ) -> None:
        self._inputs = inputs
        self._rows = rows
        self._cohorts = cohorts
        self._quota = quota
        self._book: ReclaimBook | None = None
        #: How many of the pass's displacements the book counts.
        self._booked = 0
        self._managed = {r.runtime_class for r in rows}
        self._revoke_by = now + timedelta(seconds=grace_seconds)
        self._candidates: list[Step] = []
        self._index: VictimIndex | None = None
        #: Tasks that could not reclaim, by outcome.
        self.outcomes: Counter[str] = Counter()

    @property
    def quota(self) -> QuotaBook | None:
        """Return the pass's quota book (its placements and reclaims charged so far)."""
        return self._quota

    def counted(self, task_id: object) -> bool:
        """Return whether ``task_id`` is a waiting preemptor or reclaimer (its need counted
        already)."""
        return task_id in self._inputs.waiting

    def wants(self, step: Step) -> bool:
        """Return whether a task that fits nowhere could reclaim: it lacks capacity in a
        managed runtime class and is not reclaiming already."""
        spec = step.spec
        return (step.reason.code in (_GANG if spec.is_gang else _CAPACITY)
                and spec.runtime_class in self._managed
                and step.task.id not in self._inputs.waiting)

    def refused(self, task_id: object, spec: CompiledSpec,
                book: Callable[[list[QuotaRow]], QuotaBook]) -> NoPlacement | None:
        """Return why the quota of a reclaimer's or a waiting preemptor's tenant refuses it
        now (its quota changed since it started), or None while it admits it.

        It is judged as its displacement was planned, once the leases being revoked have
        stopped: their usage is given back (a preemptor's victims are its tenant's work, a
        reclaimer's free what its cohort lends it). The need of a displacer holding capacity
        is counted in the rows as its tenant's usage: it is judged on the rows without it,
        in the quota book ``book`` builds of them (every level of the tree drawn without
        it too)."""
        need = spec.total_requests
        tenant, rc = spec.tenant_id, spec.runtime_class
        own = self.counted(task_id)
        revoking = self._inputs.revoking
        rows = []
        for r in self._rows:
            k = RESOURCES.index(r.resource)
            used = r.used - (need[k] if own and r.tenant_id == tenant and
                             r.runtime_class == rc else 0)
            given = revoking.get((r.tenant_id, r.runtime_class))
            if given is not None:
                used = max(used - given[k], 0)
            rows.append(r if used == r.used else dataclasses.replace(r, used=used))
        return book(rows).refuse(tenant, rc, need)

    def consider(self, step: Step) -> Unclaim | None:
        """Remember a task that fits nowhere for capacity in a managed runtime class."""
        if self.wants(step):
            self._candidates.append(step)
        return None

    def book(self, state: Settling) -> ReclaimBook:
        """Return the pass's reclaim book: the usage read, what revocations give back, the
        pass's placements, and the preemptions and reclaims planned so far (by every
        planner)."""
        book = self._book
        if book is None:
            book = ReclaimBook(self._rows, self._cohorts, revoking=self._inputs.revoking,
                               quota=self._quota)
            for task, spec in state.placed:
                if not self.counted(task.id):
                    book.add(spec.tenant_id, spec.runtime_class,
                             np.array(spec.total_requests, dtype=np.int64))
            self._book = book
        displacing = state.holds.displacing
        for spec, victims in displacing[self._booked:]:
            book_displaced(book, spec, victims)
        self._booked = len(displacing)
        return book

    def settle(self, state: Settling) -> None:
        """Plan the remembered tasks' reclaims, replacing their hand-backs."""
        if not self._candidates:
            return
        book = self.book(state)
        for step in self._candidates:
            if self.plan(state, step, book, None) is None:
                self.outcomes["unavailable"] += 1

    def plan(
        self, state: Settling, step: Step, book: ReclaimBook, fair: FairTest | None, *,
        kind: Kind | None = None,
    ) -> Preemption | None:
        """Plan the reclaim of one task (with ``fair``: a fair-share reclaim, granted as
        ``kind``) on ``book`` and grant it, replacing the task's hand-back; None when no set
        of victims lets it fit."""
        spec = step.spec
        index = self._index
        if index is None:
            index = self._index = VictimIndex(state.inputs.snapshot, self._inputs.victims)
        planned = plan_reclaim(
            spec, state.inputs.snapshot, index, book, assumed=state.assumed,
            taken=state.holds.taken, holds=dict(step.held) if step.held else None,
            leased_before=self._inputs.leased_before, profile=state.inputs.profile, fair=fair,
        )
        if planned is None:
            return None
        # Its need counts as its tenant's usage, in the pass's books as from the next pass
        # on: later reclaims and nominations of this pass are judged with it.
        state.holds.grant(kind or self.kind, step.task.id, spec, victims=planned.victims,
                          holds=planned.holds, revoke_by=self._revoke_by,
                          assumed=state.assumed)
        self.book(state)
        victims = tuple(v.task_id for v in planned.victims)
        doc = reclaiming_document(
            len(victims), self._revoke_by, rejections=step.reason.rejections,
            victim_ids=victims, pool_ids=[p for p, _ in planned.members],
            fair=fair is not None)
        state.unclaims[step.at] = Unclaim(step.task.id, RECLAIMING, doc, parked=True)
        return planned
