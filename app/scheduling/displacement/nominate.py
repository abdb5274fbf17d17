"""The nominate planner: a starving task gets the capacity freed on its pools held for it.

With ``nomination_seconds`` 0 it is inert. Otherwise:

* a claimed **nominee** is decided with its holds (free for it only). Placed, its
  nomination ends (``placed``). Not placed, it is handed back parked with the pending code
  ``nominated`` and keeps its holds, unless its nomination is over: its tenant's quota
  refuses it (when it is decided, or once the placements and reclaims of the pass after it
  are charged) or capacity released on its pools could no longer let it fit (``stale``), or
  a waiting task of its class ranks above it now (``not_first``); then it is handed back
  pending for its own reason and its holds go back in the same pass;
* a claimed task ranked above a nominee of its class (a higher priority under the priority
  policy, admitted before it otherwise) that fits nowhere while the nominee holds capacity
  it could use ends that nomination (``passed``): work ranked above a nominee is never held
  back by it;
* a claimed task that fits nowhere, has not fit for more than ``nomination_seconds`` and is
  the first of its class (:func:`class_head`) is a **candidate**: the core plans where it
  would fit were its pools empty of lower-ranked work
  (:func:`~app.scheduling.nomination.plan_nomination`). A plan on pools no other task is
  nominated on is a nomination: its free part is held at once (a displacement without
  victims) and the task is handed back parked ``nominated``.

At most :data:`CANDIDATES_MAX` candidates are planned per pass.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.scheduling.assumed import Assumed
from app.scheduling.displacement import Settling, Step
from app.scheduling.explain import nominated_document
from app.scheduling.inputs import NominationInputs, PassInputs, QueueHead
from app.scheduling.nomination import plan_nomination
from app.scheduling.parking import pending_stage
from app.scheduling.plugins.quota import QuotaBook
from app.scheduling.reasons import Reason
from app.scheduling.records import NOMINATED, ClaimedTask, Kind, Nomination, Unclaim, vector_sum

__all__ = ["CANDIDATES_MAX", "NewNomination", "Nominate", "class_head", "pending_since"]

#: Candidates planned per pass at most (the first in policy order).
CANDIDATES_MAX = 4
#: Headlines a nominee's own quota gives: no freed capacity can help it.
_QUOTA = frozenset({Reason.QUOTA_EXCEEDED, Reason.QUOTA_BORROW_UNAVAILABLE})


@dataclass(frozen=True, slots=True)
class NewNomination:
    """A nomination to record: its task, class and members (pool, count, need), and the
    hand-back the task gets instead when another pass nominated one of its pools first."""

    task_id: uuid.UUID
    runtime_class: str
    members: tuple[tuple[str, int, tuple[int, int, int]], ...]
    fallback: Unclaim
    at: int


def pending_since(task: ClaimedTask) -> datetime | None:
    """Return since when a claimed task has not fit, as its event log says: when it logged
    its pending code (the same code again logs nothing), or its admission for rows older
    than that record; None for a task looked at for the first time."""
    if task.pending_code is None:
        return None
    return task.logged_at or task.admitted_at


def class_head(
    heads: tuple[QueueHead, ...], task: ClaimedTask, *, by_priority: bool,
    placed: Collection[uuid.UUID],
) -> bool:
    """Return whether no waiting task of the class ranks above ``task``, the tasks in
    ``placed`` aside (``heads``: the class's first competing tasks in rank order)."""
    for task_id, priority, seq in heads:
        if task_id == task.id or task_id in placed:
            continue
        if by_priority:
            return not (priority > task.priority or (priority == task.priority
                                                     and seq < task.seq))
        return not seq < task.seq
    return True


class Nominate:
    """The nominations of one pass: nominees kept or ended, and new ones planned."""

    kind = Kind.NOMINATE

    def __init__(
        self, inputs: PassInputs, assumed: Assumed, *, quota: QuotaBook | None = None,
        pending: Callable[[Step], Unclaim] | None = None,
    ) -> None:
        seconds = inputs.settings.nomination_seconds
        self.on = seconds > 0 and inputs.nomination is not None
        self._inputs = inputs.nomination or NominationInputs()
        self.by_priority = inputs.settings.policy == "priority"
        self._cutoff = inputs.now - timedelta(seconds=seconds)
        self._now = inputs.now
        self._assumed = assumed
        #: The pass's quota book (its placements charged as they come), and the hand-back of
        #: a task pending for a step's reason.
        self._quota = quota
        self._pending = pending
        #: Nominated pools by nominee, and the nominees by runtime class.
        self.of: dict[uuid.UUID, list[Nomination]] = {}
        self._by_class: dict[str, list[uuid.UUID]] = {}
        for n in self._inputs.nominations:
            if n.state == "ADMITTED":  # else recovery removes it
                self.of.setdefault(n.task_id, []).append(n)
        for task_id, ns in self.of.items():
            self._by_class.setdefault(ns[0].runtime_class, []).append(task_id)
        #: Claimed nominees not placed, with their fallback hand-backs.
        self._kept: list[tuple[Step, Unclaim]] = []
        self._candidates: list[Step] = []
        #: Nominations ended by this pass, with their outcome; nominations planned.
        self.ended: dict[uuid.UUID, str] = {}
        self.created: list[NewNomination] = []
        #: The nominees the pass claimed (their holds are given back by the pass itself).
        self.claimed = {t.id for t, _ in inputs.tasks if t.id in self.of} if self.of else set()

    def placed(self, task: ClaimedTask) -> None:
        """Note a claimed task placed by the pass (a nominee's nomination ends)."""
        if task.id in self.of:
            self.ended[task.id] = "placed"

    def nominee(self, step: Step, fallback: Unclaim) -> Unclaim | None:
        """Return the hand-back of a claimed nominee that fits nowhere yet (None for another
        task): parked ``nominated``, keeping its holds, unless its nomination is over (then
        ``fallback``, and its holds go back). :meth:`settle` may still end it
        (``not_first``, or ``stale`` when its quota refuses it once the pass's placements and
        reclaims are charged)."""
        task, reason = step.task, step.reason
        ns = self.of.get(task.id) if self.on else None
        if ns is None:
            return None
        pools = [n.pool_id for n in ns]
        # Its own quota refuses it, or capacity released on its pools can no longer help it
        # (a pool cordoned, a label changed): a new one is planned when it starves again.
        if reason.code in _QUOTA or (
                reason.wake_pools is not None and not set(pools) & set(reason.wake_pools)):
            self.ended[task.id] = "stale"
            if step.held:
                # Its holds go back at commit: later tasks of the pass may use them now.
                self._assumed.hold(f"{task.id}:released", [
                    (p, (-a[0], -a[1], -a[2])) for p, a in step.held.items()])
            return fallback
        self._kept.append((step, fallback))
        held = step.held or {}
        doc = nominated_document(
            reason, pool_ids=pools, need=vector_sum(n.need for n in ns),
            held=vector_sum(held.get(p, (0, 0, 0)) for p in pools), since=ns[0].created_at,
        )
        return Unclaim(task.id, NOMINATED, doc, parked=True, wake=None,
                       stage=pending_stage(str(reason.code)),
                       event=task.pending_code != NOMINATED)

    def consider(self, step: Step) -> Unclaim | None:
        """Look at a claimed task (not a nominee) that fits nowhere: it ends the nominations
        of lower-ranked nominees of its class that hold capacity it could use, and is a
        candidate once it waited long enough."""
        if not self.on or step.reason.code in _QUOTA:
            return None
        task, reason = step.task, step.reason
        for other in self._by_class.get(step.spec.runtime_class, ()):
            n = self.of[other][0]
            above = (n.priority, -n.seq) < (task.priority, -task.seq) if self.by_priority \
                else task.seq < n.seq
            if above and other not in self.ended and (
                reason.wake_pools is None
                or {x.pool_id for x in self.of[other]} & set(reason.wake_pools)
            ):
                self.ended[other] = "passed"
        if len(self._candidates) < CANDIDATES_MAX and task.id in self._inputs.lower:
            since = pending_since(task)
            if since is not None and since <= self._cutoff:
                self._candidates.append(step)
        return None

    def settle(self, state: Settling) -> None:
        """End the nominations of nominees no longer first or their quota now refuses, keep
        the others' holds, and nominate the candidates that are first of their class (and
        that their quota admits)."""
        if not self.on:
            return
        placed = {t.id for t, _ in state.placed}
        for step, fallback in self._kept:
            task = step.task
            n = self.of[task.id][0]
            if task.id in self.ended or not self._head(n.runtime_class, task, placed):
                self.ended.setdefault(task.id, "not_first")
                state.unclaims[step.at] = fallback
                continue
            # Work placed later in the pass may have taken what its quota needed: then its
            # holds go back in this pass, and it waits for its quota.
            refused = self._refused(step)
            if refused is None:
                state.holds.kept.add(task.id)
                continue
            self.ended[task.id] = "stale"
            state.unclaims[step.at] = refused
        taken = {n.pool_id for ns in self.of.values() for n in ns}
        for step in self._candidates:
            self._nominate(step, state, taken, placed)

    def passed(self) -> list[uuid.UUID]:
        """Return the nominees this pass passed that it did not claim (their holds go back
        once their rows are locked at commit)."""
        return sorted(t for t, o in self.ended.items() if o == "passed" and t not in self.claimed)

    def _refused(self, step: Step) -> Unclaim | None:
        """Return the hand-back of a task its quota refuses in the pass's book (its
        placements and reclaims charged), pending for that reason; None while it admits
        it."""
        if self._quota is None or self._pending is None:
            return None
        spec = step.spec
        reason = self._quota.refuse(spec.tenant_id, spec.runtime_class, spec.total_requests)
        return None if reason is None else self._pending(dataclasses.replace(step, reason=reason))

    def _head(self, runtime_class: str, task: ClaimedTask, placed: Collection[uuid.UUID]) -> bool:
        heads = self._inputs.heads.get(runtime_class, ())
        return class_head(heads, task, by_priority=self.by_priority, placed=placed)

    def _nominate(self, step: Step, state: Settling, taken: set[str],
                  placed: Collection[uuid.UUID]) -> None:
        task, spec, holds = step.task, step.spec, state.holds
        if task.id in self.of or task.id in holds.grants or holds.of(task.id):
            return  # nominated already, displacing already, or holding capacity of its own
        if not self._head(spec.runtime_class, task, placed) or self._refused(step) is not None:
            return
        plan = plan_nomination(spec, state.inputs.snapshot, lower=self._inputs.lower[task.id],
                               assumed=state.assumed, exclude=frozenset(taken),
                               profile=state.inputs.profile)
        if plan is None:
            return
        taken.update(p for p, _, _, _ in plan.pools)
        holds.grant(self.kind, task.id, spec, victims=(),
                    holds=tuple((p, c, free) for p, c, _, free in plan.pools),
                    revoke_by=self._now, assumed=state.assumed)
        doc = nominated_document(
            step.reason, pool_ids=[p for p, _, _, _ in plan.pools], need=plan.need,
            held=plan.free, since=self._now,
        )
        self.created.append(NewNomination(
            task.id, spec.runtime_class, tuple((p, c, need) for p, c, need, _ in plan.pools),
            state.unclaims[step.at], step.at))
        state.unclaims[step.at] = Unclaim(task.id, NOMINATED, doc, parked=True, wake=None,
                                          stage=pending_stage(str(step.reason.code)),
                                          event=True)
