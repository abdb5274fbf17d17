"""A pass's nominations: starving tasks get the capacity freed on their pools held for them.

With ``nomination_seconds`` 0 nothing here runs. Otherwise a pass reads the nominations (one
small read: a row per nominated pool) and:

* a claimed **nominee** is decided with its holds (free for it only, like a preemptor's).
  Placed, its nomination ends (``placed``) and its holds are taken at commit. Not placed,
  it is handed back parked with the pending code ``nominated`` and keeps its holds, unless
  a waiting task of its class ranks above it now (``not_first``), or capacity released on
  its pools could no longer let it fit (``stale``): then its holds go back at commit;
* a claimed task ranked above a nominee of its class (a higher priority under the priority
  policy, admitted before it otherwise) that fits nowhere
  while the nominee holds capacity it could use ends that nomination (``passed``): work
  ranked above a nominee is never held back by it. The nominee, if no other pass holds it,
  is unparked and its holds go back at commit;
* a claimed task that fits nowhere, and has not fit for more than ``nomination_seconds``
  (since its pending code was logged), is a **candidate**: if no waiting task of its
  runtime class ranks above it (:func:`app.ledger.nominations.class_head`), the core plans
  where it would fit were its pools empty of lower-ranked work
  (:func:`app.scheduling.nomination.plan_nomination`, the pipeline's own ``decide``). A plan
  on pools no other task is nominated on is recorded (``nominated`` event and pending
  reason), and the free part of its need is held at once: a preemption without victims
  (:class:`~app.ledger.preemption.PreemptionGrant`), applied by the pass's plan and assumed
  so later tasks of the pass do not take it. The rest is held as leases on those pools end
  (:func:`app.ledger.nominations.nominations_capture`).

The candidate check costs nothing for a task that started waiting recently; at most
:data:`CANDIDATES_MAX` candidates are planned per pass.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from app.db import Connection
from app.ledger.claims import ClaimedTask, Unclaim
from app.ledger.events import task_events_add
from app.ledger.nominations import (
    NOMINATED,
    NOMINATION_ENDED,
    Nomination,
    class_head,
    lower_usage_read,
    nominations_delete,
    nominations_insert,
    nominations_read,
    nominees_release,
)
from app.ledger.preemption import PreemptionGrant, holds_read
from app.reconciler.preempting import PassPreemption
from app.scheduling.assumed import Assumed
from app.scheduling.nomination import nominated_document, plan_nomination, vector_sum
from app.scheduling.parking import pending_stage
from app.scheduling.preemption import Vector
from app.scheduling.results import NoPlacement
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

#: Candidates planned per pass at most (the first in policy order).
CANDIDATES_MAX = 4



def _pending_since(task: ClaimedTask) -> datetime | None:
    """Return since when a claimed task has not fit, as its event log says: when it logged
    its pending code (the same code again logs nothing), or its admission for rows older
    than that record; None for a task looked at for the first time."""
    if task.pending_code is None:
        return None
    return task.logged_at or task.admitted_at


class PassNomination:
    """The nomination state of one pass (inert when ``seconds`` is 0)."""

    def __init__(self, *, seconds: float, now: datetime, by_priority: bool = False) -> None:
        self.on = seconds > 0
        #: The rank: priority, then admission (the priority policy), or admission only.
        self.by_priority = by_priority
        self.cutoff = now - timedelta(seconds=seconds)
        self.now = now
        #: Nominated pools by nominee, and the nominees by runtime class.
        self.of: dict[uuid.UUID, list[Nomination]] = {}
        self._by_class: dict[str, list[uuid.UUID]] = {}
        self._held: dict[uuid.UUID, dict[str, Vector]] = {}
        #: Claimed nominees not placed: (task, index in the hand-backs, fallback hand-back).
        self._kept: list[tuple[ClaimedTask, int, Callable[[], Unclaim]]] = []
        #: Claimed tasks that fit nowhere and waited long enough: (task, spec, reason, index).
        self._candidates: list[tuple[ClaimedTask, CompiledSpec, NoPlacement, int]] = []
        #: Nominations ended by this pass, with their outcome.
        self.ended: dict[uuid.UUID, str] = {}
        #: Tasks nominated by this pass.
        self.created: set[uuid.UUID] = set()
        #: Nominations started and ended, by outcome (the metric, counted at commit).
        self.outcomes: Counter[str] = Counter()
        self._placed: list[uuid.UUID] = []

    async def load(
        self, conn: Connection, *, claimed: Iterable[tuple[ClaimedTask, CompiledSpec]],
        preemption: PassPreemption,
    ) -> None:
        """Read the nominations and the holds of the claimed nominees (merged into the
        pass's holds, so ``decide`` lets each use its own)."""
        if not self.on:
            return
        rows = await nominations_read(conn)
        if not rows:
            return
        for n in rows:
            if n.state != "ADMITTED":
                continue  # recovery removes it
            self.of.setdefault(n.task_id, []).append(n)
        for task_id, ns in self.of.items():
            self._by_class.setdefault(ns[0].runtime_class, []).append(task_id)
        mine = [t.id for t, _ in claimed if t.id in self.of]
        if mine:
            held = await holds_read(conn, task_ids=mine)
            for task_id in mine:
                self._held[task_id] = held.get(task_id, {})
                preemption.holds[task_id] = self._held[task_id]

    @property
    def nominees(self) -> bool:
        """Return whether any nomination is in place."""
        return bool(self.of)

    def placed(self, task: ClaimedTask) -> None:
        """Note a claimed task placed by the pass (a nominee's nomination ends)."""
        if task.id in self.of:
            self.ended[task.id] = "placed"

    def nominee(
        self, task: ClaimedTask, reason: NoPlacement, fallback: Callable[[], Unclaim],
        index: int,
    ) -> Unclaim:
        """Return the hand-back of a claimed nominee that fits nowhere yet (to be put at
        ``index`` of the pass's hand-backs): parked ``nominated``, keeping its holds, unless
        :meth:`settle` finds its nomination over (then ``fallback()`` replaces it)."""
        ns = self.of[task.id]
        pools = [n.pool_id for n in ns]
        # Capacity released on its pools can no longer help it (a pool cordoned, a label
        # changed): the nomination is stale, and a new one is planned when it starves again.
        if reason.wake_pools is not None and not set(pools) & set(reason.wake_pools):
            self.ended[task.id] = "stale"
        self._kept.append((task, index, fallback))
        held = self._held.get(task.id, {})
        doc = nominated_document(
            reason, pool_ids=pools, need=vector_sum(n.need for n in ns),
            held=vector_sum(held.get(p, (0, 0, 0)) for p in pools), since=ns[0].created_at,
        )
        return Unclaim(task.id, NOMINATED, doc, parked=True, wake=None,
                       stage=pending_stage(str(reason.code)),
                       event=task.pending_code != NOMINATED)

    def consider(
        self, task: ClaimedTask, spec: CompiledSpec, reason: NoPlacement, index: int
    ) -> None:
        """Look at a claimed task (not a nominee) that fits nowhere, handed back at
        ``index``: it ends the nominations of lower-priority nominees of its class that hold
        capacity it could use, and is a candidate once it waited long enough."""
        for other in self._by_class.get(spec.runtime_class, ()):
            n = self.of[other][0]
            above = (n.priority, -n.seq) < (task.priority, -task.seq) if self.by_priority \
                else task.seq < n.seq
            if above and other not in self.ended and (
                reason.wake_pools is None
                or {x.pool_id for x in self.of[other]} & set(reason.wake_pools)
            ):
                self.ended[other] = "passed"
        if len(self._candidates) < CANDIDATES_MAX:
            since = _pending_since(task)
            if since is not None and since <= self.cutoff:
                self._candidates.append((task, spec, reason, index))

    async def settle(
        self, conn: Connection, *, unclaims: list[Unclaim], snapshot: Snapshot,
        assumed: Assumed, preemption: PassPreemption, placed: Iterable[uuid.UUID],
    ) -> None:
        """Before the plan commits: end nominations, nominate the candidates that are the
        first of their priority in their class, and tell the preemption state which holds
        stay and which go back."""
        if not self.on:
            return
        now = self.now
        # Tasks ranked above a candidate that this pass places are not in its way.
        self._placed = list(placed)
        for task, index, fallback in self._kept:
            n = self.of[task.id][0]
            if task.id not in self.ended and await class_head(
                conn, task_id=task.id, runtime_class=n.runtime_class, priority=task.priority,
                seq=task.seq, by_priority=self.by_priority, placed=self._placed,
            ):
                preemption.kept.add(task.id)
                continue
            self.ended.setdefault(task.id, "not_first")
            unclaims[index] = fallback()
        claimed_nominees = set(self._held)
        passed = [t for t, o in self.ended.items() if o == "passed"
                  and t not in claimed_nominees]
        if passed:
            # Nominees no other pass holds: unparked, their holds given back at commit.
            locked = await nominees_release(conn, task_ids=passed, now=now)
            for t in passed:
                if t not in locked:
                    del self.ended[t]
            preemption.released.update(locked)
        taken = {p for ns in self.of.values() for p in (n.pool_id for n in ns)}
        for task, spec, reason, index in self._candidates:
            await self._nominate(conn, task, spec, reason, index, unclaims=unclaims,
                                 snapshot=snapshot, assumed=assumed, preemption=preemption,
                                 taken=taken)
        if self.ended:
            gone = await nominations_delete(conn, task_ids=list(self.ended))
            await task_events_add(conn, rows=[
                {"task_id": t, "from_state": "ADMITTED", "to_state": "ADMITTED",
                 "reason": NOMINATION_ENDED, "detail": {"outcome": o}}
                for t, o in sorted(self.ended.items()) if t in gone
            ], now=now)
            self.outcomes.update(o for t, o in self.ended.items() if t in gone)

    async def _nominate(
        self, conn: Connection, task: ClaimedTask, spec: CompiledSpec, reason: NoPlacement,
        index: int, *, unclaims: list[Unclaim], snapshot: Snapshot, assumed: Assumed,
        preemption: PassPreemption, taken: set[str],
    ) -> None:
        if task.id in self.of or task.id in preemption.grants or preemption.holds.get(task.id):
            return
        if not await class_head(conn, task_id=task.id, runtime_class=spec.runtime_class,
                                priority=task.priority, seq=task.seq,
                                by_priority=self.by_priority, placed=self._placed):
            return
        code = snapshot.rc_table.get(spec.runtime_class)
        if code is None:
            return
        pools = [snapshot.ids[i] for i in (snapshot.rc == code).nonzero()[0].tolist()]
        lower = await lower_usage_read(conn, pool_ids=pools, priority=task.priority,
                                       seq=task.seq, by_priority=self.by_priority)
        plan = plan_nomination(spec, snapshot, lower=lower, assumed=assumed,
                               exclude=frozenset(taken))
        if plan is None:
            return
        if await holds_read(conn, task_ids=[task.id]):
            return  # holds of its own already (a preemptor's)
        if not await nominations_insert(
            conn, task_id=task.id, runtime_class=spec.runtime_class,
            members=[(p, c, need) for p, c, need, _ in plan.pools], now=self.now,
        ):
            return
        taken.update(p for p, _, _, _ in plan.pools)
        assumed.hold(str(task.id), [(p, free) for p, _, _, free in plan.pools])
        preemption.grants[task.id] = PreemptionGrant(
            task.id, (), tuple((p, c, free) for p, c, _, free in plan.pools), self.now
        )
        doc = nominated_document(
            reason, pool_ids=[p for p, _, _, _ in plan.pools], need=plan.need,
            held=plan.free, since=self.now,
        )
        unclaims[index] = Unclaim(task.id, NOMINATED, doc, parked=True, wake=None,
                                  stage=pending_stage(str(reason.code)), event=True)
        self.created.add(task.id)
        self.outcomes["nominated"] += 1

    def dropped(self, lost: Iterable[uuid.UUID]) -> None:
        """Forget nominations whose holds lost a ledger race (their rows stay: the nominee
        is retried, and gathers its holds as leases end)."""
        for t in lost:
            if t in self.created:
                self.created.discard(t)
                self.outcomes["nominated"] -= 1

    def detail(self) -> dict[str, Any]:
        """Return the pass's nomination counts (for its log line)."""
        return dict(self.outcomes)
