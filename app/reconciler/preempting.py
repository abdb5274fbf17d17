"""A pass's preemptions: what its preemptors hold and wait for, and the preemptions it plans.

Only claimed tasks whose spec says ``preemption: "lowerPriority"`` cost anything here; a pass
without such tasks reads nothing more. For those:

* :meth:`PassPreemption.load` reads their holds (capacity nominated for them, free for them
  only), whether victims of theirs are still revoking, and the displaceable leased tasks of
  their tenants;
* a preemptor still waiting for victims is handed back parked as it was (:meth:`waiting`);
* a preemptor that fits nowhere asks the core for the cheapest preemption
  (:meth:`plan`): its victims are kept from later preemptors of the pass, its hold on the
  free capacity is assumed so later tasks see it, and it is handed back parked with the
  pending code ``preempting`` (the count of victims and the deadline);
* at commit the plan carries the preemptions and the holds given back
  (:meth:`holds_taken`); a preemption whose victims changed meanwhile is lost and the
  preemptor goes back to the queue unparked (:meth:`drop`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from app.db import Connection
from app.ledger.claims import ClaimedTask, Unclaim
from app.ledger.preemption import (
    PREEMPTING,
    PreemptionGrant,
    holds_read,
    preemptors_waiting,
    victims_read,
)
from app.ledger.reclaim import RECLAIMING
from app.ledger.reservations import Vector
from app.reconciler.reclaiming import reclaiming_document
from app.scheduling.assumed import Assumed
from app.scheduling.preemption import VictimIndex, plan_preemption, waiting_document
from app.scheduling.results import NoPlacement
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

#: Event reason of a preemptor whose victims changed before its preemption committed.
PREEMPTION_CONFLICT = "preemption_conflict"


def preempting_document(
    victims: int, revoke_by: datetime, *, rejections: Mapping[str, int] | None = None,
    victim_ids: Iterable[str] = (), pool_ids: Iterable[str] = (),
) -> dict[str, Any]:
    """Build the pending reason of a preemptor waiting for ``victims`` tasks to stop."""
    noun = "task" if victims == 1 else "tasks"
    return waiting_document(
        PREEMPTING, f"preempting: waiting for {victims} lower-priority {noun} of this tenant "
        "to stop", victims, revoke_by, rejections=rejections, victim_ids=victim_ids,
        pool_ids=pool_ids)


class PassPreemption:
    """The preemption state of one pass (empty, and free, without preemptors)."""

    def __init__(self, *, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self.holds: dict[uuid.UUID, dict[str, Vector]] = {}
        self._waiting: dict[uuid.UUID, tuple[int, datetime]] = {}
        self._victims: list = []
        self._index: VictimIndex | None = None
        self._taken: set[str] = set()
        self.grants: dict[uuid.UUID, PreemptionGrant] = {}
        #: Holders that keep their holds though handed back parked (nominees still
        #: nominated), and holders whose holds go back though not claimed (nominations
        #: ended by this pass): see app.reconciler.nominating.
        self.kept: set[uuid.UUID] = set()
        self.released: set[uuid.UUID] = set()

    async def load(
        self, conn: Connection, *, claimed: Iterable[tuple[ClaimedTask, CompiledSpec]],
    ) -> None:
        """Read the holds, waits and possible victims of the claimed preemptors (``claimed``:
        the claimed tasks whose specs compiled, with their specs)."""
        # Reclaimers (app.reconciler.reclaiming) hold and wait as preemptors do.
        holders = [t for t, spec in claimed
                   if spec.may_preempt or t.pending_code == RECLAIMING]
        if not holders:
            return
        ids = [t.id for t in holders]
        self.holds = await holds_read(conn, task_ids=ids)
        self._waiting = await preemptors_waiting(conn, task_ids=ids)
        below: dict[str, int] = {}
        for t, spec in claimed:
            if spec.may_preempt:
                below[t.tenant_id] = max(below.get(t.tenant_id, t.priority), t.priority)
        self._victims = await victims_read(conn, below=below)

    @property
    def waits(self) -> bool:
        """Return whether a claimed preemptor is waiting for its victims (else
        :meth:`waiting` is None for every task)."""
        return bool(self._waiting)

    def waiting(self, task: ClaimedTask) -> Unclaim | None:
        """Return the hand-back of a preemptor whose victims are still revoking, else None."""
        wait = self._waiting.get(task.id)
        if wait is None:
            return None
        if task.pending_code == RECLAIMING:
            return Unclaim(task.id, RECLAIMING, reclaiming_document(*wait), parked=True)
        return Unclaim(task.id, PREEMPTING, preempting_document(*wait), parked=True)

    def waiting_ids(self) -> frozenset[uuid.UUID]:
        """Return the claimed preemptors and reclaimers still waiting for victims."""
        return frozenset(self._waiting)

    @property
    def taken(self) -> set[str]:
        """Return the victims the pass's preemptions took (reclaims add theirs)."""
        return self._taken

    def plan(
        self, task: ClaimedTask, spec: CompiledSpec, reason: NoPlacement, *,
        snapshot: Snapshot, assumed: Assumed, now: datetime,
    ) -> Unclaim | None:
        """Plan a preemption for a task that fits nowhere; return its hand-back, or None."""
        if not spec.may_preempt or not self._victims:
            return None
        if self._index is None:
            self._index = VictimIndex(snapshot, self._victims)
        planned = plan_preemption(
            spec, snapshot, self._index, assumed=assumed, taken=self._taken,
            holds=self.holds.get(task.id),
        )
        if planned is None:
            return None
        victims = tuple(v.task_id for v in planned.victims)
        self._taken.update(victims)
        assumed.hold(spec.task_id or str(task.id), [(p, a) for p, _, a in planned.holds])
        revoke_by = now + timedelta(seconds=self.grace_seconds)
        self.grants[task.id] = PreemptionGrant(
            task.id, tuple(uuid.UUID(v) for v in victims), planned.holds, revoke_by
        )
        doc = preempting_document(
            len(victims), revoke_by, rejections=reason.rejections, victim_ids=victims,
            pool_ids=[p for p, _ in planned.members],
        )
        return Unclaim(task.id, PREEMPTING, doc, parked=True)

    def holds_taken(
        self, granted: Iterable[uuid.UUID], unclaims: Iterable[Unclaim]
    ) -> tuple[uuid.UUID, ...]:
        """Return the tasks whose holds the plan gives back: placed ones, and ones handed back
        parked for another reason than waiting (a new preemption takes new holds)."""
        if not self.holds and not self.released:
            return ()
        out = [t for t in granted if t in self.holds]
        for u in unclaims:
            if (u.task_id in self.holds and u.parked and u.task_id not in self._waiting
                    and u.task_id not in self.kept):
                out.append(u.task_id)
        out.extend(self.released)
        return tuple(sorted(set(out)))

    def holding_on(self, pools: Collection[str] | None) -> set[uuid.UUID]:
        """Return the planned preemptors that reserve a positive hold on one of ``pools``
        (None: on any pool) — those a lost ledger race can refuse."""
        return {
            t for t, g in self.grants.items()
            if any(any(a) and (pools is None or p in pools) for p, _, a in g.holds)
        }

    def drop(self, lost: Collection[uuid.UUID], unclaims: list[Unclaim]) -> None:
        """Forget the lost preemptions: their preemptors go back to the queue unparked."""
        for i, u in enumerate(unclaims):
            if u.task_id in lost:
                unclaims[i] = Unclaim(u.task_id, PREEMPTION_CONFLICT, None, parked=False)
                self.grants.pop(u.task_id, None)
