"""The preempt planner: a task that may preempt takes lower-priority leases of its tenant.

A claimed task whose spec says ``preemption: "lowerPriority"`` and that fits nowhere (but
within its quota) asks :func:`~app.scheduling.preemption.plan_preemption` for the cheapest
preemption on top of the pass's decisions so far; planned, it is granted at once (later
tasks of the pass see its holds and cannot take its victims, and its quota book counts its
need less what its victims give back) and handed back parked with the pending code
``preempting``.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from app.scheduling.assumed import Assumed
from app.scheduling.displacement import Holds, Settling, Step
from app.scheduling.explain import preempting_document
from app.scheduling.plugins.registry import Profile
from app.scheduling.preemption import Preemption, Victim, VictimIndex, plan_preemption
from app.scheduling.records import PREEMPTING, Kind, Unclaim
from app.scheduling.snapshot import Snapshot

__all__ = ["Preempt"]


class Preempt:
    """Plans the pass's preemptions, in its order, as its tasks fit nowhere."""

    kind = Kind.PREEMPT

    def __init__(
        self, snapshot: Snapshot, victims: tuple[Victim, ...], *, holds: Holds,
        assumed: Assumed, now: datetime, grace_seconds: float, profile: Profile,
        explain: bool = False,
    ) -> None:
        self._snapshot = snapshot
        self._profile = profile
        self._explain = explain
        #: With ``explain``: the preemption planned for each task (every candidate pool).
        self.planned: dict[uuid.UUID, Preemption] = {}
        self._victims = victims
        self._index: VictimIndex | None = None
        self._holds = holds
        self._assumed = assumed
        self._revoke_by = now + timedelta(seconds=grace_seconds)

    def consider(self, step: Step) -> Unclaim | None:
        """Plan a preemption for a task that fits nowhere; return its hand-back, or None."""
        spec = step.spec
        if not spec.may_preempt or not self._victims:
            return None
        if self._index is None:
            self._index = VictimIndex(self._snapshot, self._victims)
        planned = plan_preemption(
            spec, self._snapshot, self._index, assumed=self._assumed,
            taken=self._holds.taken, holds=dict(step.held) if step.held else None,
            profile=self._profile, explain=self._explain,
        )
        if planned is None:
            return None
        if self._explain:
            self.planned[step.task.id] = planned
        victims = tuple(v.task_id for v in planned.victims)
        self._holds.grant(self.kind, step.task.id, spec, victims=planned.victims,
                          holds=planned.holds, revoke_by=self._revoke_by, assumed=self._assumed)
        doc = preempting_document(
            len(victims), self._revoke_by, rejections=step.reason.rejections,
            victim_ids=victims, pool_ids=[p for p, _ in planned.members],
        )
        return Unclaim(step.task.id, PREEMPTING, doc, parked=True)

    def settle(self, state: Settling) -> None:
        """Nothing is left to plan: preemptions are planned as their tasks come."""
