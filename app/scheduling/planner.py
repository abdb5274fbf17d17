"""The planner of a pass: a pure function from :class:`PassInputs` to :class:`PassPlan`.

A pass is ``read -> plan -> commit``: the reconciler reads one immutable
:class:`~app.scheduling.inputs.PassInputs`, :func:`plan_pass` plans (no I/O, no clock read,
deterministic), and the reconciler commits the plan through the ledger, the only writer.
The previews (a placement, a drain) read their own inputs and plan with the same function,
without the commit.

:func:`plan_pass`, in the configured policy's order:

1. a task whose victims are still stopping is handed back as it waits;
2. every other task (in that order, but the tasks that must borrow by their tenants'
   shares: :func:`~app.scheduling.fairshare.fair_order`) is decided by the one pipeline
   (:func:`~app.scheduling.framework.decide`) with its holds and the pass's quota book; a
   placement is assumed (later tasks see it) and charged to the book; a spec that fits
   nowhere is remembered in the pass's
   :class:`~app.scheduling.unsatisfiable.UnsatisfiableCache` (later tasks of the same
   fingerprint are skipped with the same reason);
3. a task that fits nowhere goes to the displacement planners
   (:mod:`app.scheduling.displacement`: preempt, reclaim, fair-share reclaim, nominate, in
   that order), and is
   otherwise handed back parked with its reason and wake keys;
4. after the last task, the planners settle (reclaims and nominations are planned on top of
   every placement of the pass).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from app.scheduling.assumed import Assumed
from app.scheduling.displacement import Displacement, Holds, HoldsPlan, Settling, Step
from app.scheduling.displacement.fairshare import FairShareReclaim
from app.scheduling.displacement.nominate import NewNomination, Nominate
from app.scheduling.displacement.preempt import Preempt
from app.scheduling.displacement.reclaim import Reclaim
from app.scheduling.explain import error_document, no_placement_document
from app.scheduling.fairshare import FairShares, fair_order
from app.scheduling.framework import decide
from app.scheduling.inputs import PassInputs, PassSettings
from app.scheduling.parking import STAGE_NONE, pending_stage, wake_keys
from app.scheduling.plugins.quota import QuotaBook, QuotaRow, cohort_rows_drawn
from app.scheduling.policies import QueuedTask, get_policy
from app.scheduling.preemption import Preemption
from app.scheduling.reasons import Reason
from app.scheduling.records import (
    PREEMPTING,
    RECLAIMING,
    ClaimedTask,
    Displaced,
    Unclaim,
    Vector,
)
from app.scheduling.results import Ranked, Result
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from app.scheduling.unsatisfiable import UnsatisfiableCache

__all__ = [
    "INVALID_SPEC",
    "SCHEDULER_ERROR",
    "PassPlan",
    "Placed",
    "ordered_tasks",
    "pending_logged",
    "plan_outcomes",
    "plan_pass",
    "queue_order",
    "queued_task",
]

log = logging.getLogger("berth.scheduling")

#: Event reason and pending code of a stored spec the core cannot read.
INVALID_SPEC = "invalid_spec"
#: Event reason and pending code of a task the core raised an error on (a bug, logged).
SCHEDULER_ERROR = "scheduler_error"
#: Headlines of a task its own quota stops: it displaces nothing.
_QUOTA_CODES = frozenset({Reason.QUOTA_EXCEEDED, Reason.QUOTA_BORROW_UNAVAILABLE})


class Placed(NamedTuple):
    """A task the planner placed: its spec, the core's decision and its members (a named
    tuple: one per placement of a pass)."""

    task: ClaimedTask
    spec: CompiledSpec
    #: The core's decision: a single-member placement's plain values, or a result.
    result: Result | Ranked
    members: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class PassPlan:
    """What a pass decided, for the commit to apply."""

    placed: tuple[Placed, ...] = ()
    #: The claimed tasks handed back, pending (parked) or waiting.
    unclaims: tuple[Unclaim, ...] = ()
    #: Displacements planned (preemptions, reclaims, nominations), in the pass's order.
    displaced: tuple[Displaced, ...] = ()
    holds: HoldsPlan = field(default_factory=HoldsPlan)
    #: Nominations ended (by outcome), new ones, and passed nominees the pass did not claim.
    nominations_ended: Mapping[uuid.UUID, str] = field(default_factory=dict)
    nominations_created: tuple[NewNomination, ...] = ()
    nominees_passed: tuple[uuid.UUID, ...] = ()
    #: Filter rejections by reason code over the pass's decisions.
    rejections: Mapping[str, int] = field(default_factory=dict)
    unsatisfiable_hits: int = 0
    #: Tasks that could not reclaim (their nominal, their fair share), by outcome.
    reclaims: Mapping[str, int] = field(default_factory=dict)
    fair_reclaims: Mapping[str, int] = field(default_factory=dict)
    #: With ``explain``: each task's explained decision, and the preemption planned for it.
    explained: Mapping[uuid.UUID, Result] = field(default_factory=dict)
    preemptions: Mapping[uuid.UUID, Preemption] = field(default_factory=dict)


def pending_logged(task: ClaimedTask, code: str, *, now: datetime, period: float) -> bool:
    """Return whether handing ``task`` back pending for ``code`` writes an event.

    A first examination always does, and so does the end of a displacement's wait (a
    preemption or reclaim is over: not a flap). A re-examination does only when ``code``
    differs from the code the task's event log last recorded, and that record is at least
    ``period`` seconds old: a pool whose health flaps changes the reason of every task
    parked on it back and forth, and each task then logs at most one change per period.
    """
    if task.pending_code is None or task.pending_code in (PREEMPTING, RECLAIMING):
        return True
    logged = task.logged_code if task.logged_code is not None else task.pending_code
    if code == logged:
        return False
    return task.logged_at is None or (now - task.logged_at).total_seconds() >= period


def pending_unclaim(
    task: ClaimedTask, code: str, document: Mapping[str, object],
    wake: tuple[str, ...] | None, *, now: datetime, settings: PassSettings,
) -> Unclaim:
    """Return the parking hand-back of a task pending for ``code``, with an event only when
    :func:`pending_logged` says so; an event past the task's kept pending events trims its
    log to the first event and the latest kept ones."""
    event = pending_logged(task, code, now=now, period=settings.park_sweep_seconds)
    keep = settings.task_events_kept
    return Unclaim(
        task.id, code, document, parked=True, wake=wake,
        stage=pending_stage(code) if wake is not None else STAGE_NONE,
        event=event, trim_to=keep if event and task.logged_count >= keep else None,
    )


def queued_task(
    key: str, tenant_id: str, priority: int, seq: int, admitted_at: datetime, spec: CompiledSpec
) -> QueuedTask:
    """Return a task as the policy sees it (a gang asks for all its members' requests)."""
    r, n = spec.requests, spec.members
    return QueuedTask(key, tenant_id, priority, seq, admitted_at.timestamp(),
                      r if n == 1 else (r[0] * n, r[1] * n, r[2] * n))


def queue_order(
    settings: PassSettings,
    queued: list[QueuedTask],
    *,
    snapshot: Snapshot,
    usage: Mapping[str, Vector],
    now: datetime,
    entitlements: Mapping[str, tuple[float, float, float]] | None = None,
) -> list[QueuedTask]:
    """Return ``queued`` in the order the configured policy decides them on ``snapshot``
    (under ``fair``, tenants with ``entitlements`` are measured against nominal x weight)."""
    options: dict[str, object] = (
        {"aging_seconds": settings.priority_aging_seconds}
        if settings.policy == "priority" else {}
    )
    if settings.policy == "fair" and entitlements:
        options["entitlements"] = entitlements
    policy = get_policy(settings.policy, **options)
    total = snapshot.cap.sum(axis=0) if snapshot.n else (0, 0, 0)
    capacity = (int(total[0]), int(total[1]), int(total[2]))
    return policy.order(
        queued, now=now.timestamp(), tenant_usage=usage, cluster_capacity=capacity
    )


def ordered_tasks(inputs: PassInputs) -> list[tuple[ClaimedTask, CompiledSpec]]:
    """Return the inputs' tasks in the configured policy's order."""
    by_id = {str(t.id): (t, spec) for t, spec in inputs.tasks}
    ordered = queue_order(
        inputs.settings,
        [queued_task(key, t.tenant_id, t.priority, t.seq, t.admitted_at, spec)
         for key, (t, spec) in by_id.items()],
        snapshot=inputs.snapshot, usage=inputs.usage, now=inputs.now,
        entitlements=inputs.entitlements,
    )
    return [by_id[q.task_id] for q in ordered]


def _no_phase(_phase: str | None) -> None:
    """Mark nothing (a plan without a CPU counter)."""


def _pending(step: Step, *, now: datetime, settings: PassSettings) -> Unclaim:
    """Return the parking hand-back of a task pending for the step's reason."""
    reason = step.reason
    return pending_unclaim(
        step.task, str(reason.code), no_placement_document(reason),
        wake_keys(step.spec, reason), now=now, settings=settings)


class _Planning:
    """The state of one plan: the assumed overlay, the cache, the book, the planners."""

    def __init__(self, inputs: PassInputs,
                 phase: Callable[[str | None], None] = _no_phase) -> None:
        self.inputs = inputs
        self.phase = phase
        self.assumed = Assumed(inputs.snapshot)
        self.cache = UnsatisfiableCache(self.assumed)
        self.book = (QuotaBook(inputs.quota_rows, inputs.cohorts, inputs.quota_cohorts,
                               inputs.tenant_weights)
                     if inputs.quota_rows or inputs.quota_cohorts else None)
        self.shares = FairShares(
            self.book, decayed=inputs.fair_usage
            if inputs.settings.fair_usage_half_life_seconds > 0 else None,
        ) if self.book is not None else None
        self.holds = Holds(inputs.holds, inputs.waiting, quota=self.book)
        self.unclaims: list[Unclaim] = [
            pending_unclaim(t, INVALID_SPEC, error_document(
                INVALID_SPEC, f"stored spec cannot be read: {why}"), None,
                now=inputs.now, settings=inputs.settings)
            for t, why in inputs.invalid
        ]
        self.placed: list[Placed] = []
        settings = inputs.settings
        self.explain = settings.explain
        self.top_k = settings.top_k
        self.components = settings.explain_components
        self.explained: dict[uuid.UUID, Result] = {}
        self.unsatisfiable = False
        #: The rejection counts maps of the pass's outcomes, by identity (kept alive here,
        #: so an id is never reused), with how many tasks had each.
        self.counts_seen: dict[int, list] = {}
        # A function of the inputs, not a method: the pass's objects hold no cycle, so a
        # pass's snapshot is freed by reference counting once the next one replaces it.
        self.nominate = Nominate(inputs, self.assumed, quota=self.book, pending=functools.partial(
            _pending, now=inputs.now, settings=settings))
        self.reclaim = Reclaim(
            inputs.reclaim, inputs.quota_rows, self._trees(), now=inputs.now,
            grace_seconds=settings.preemption_grace_seconds, quota=self.book,
        ) if inputs.reclaim is not None and inputs.quota_rows else None
        self.fair = FairShareReclaim(self.reclaim) if self.reclaim is not None else None
        self.preempt = preempt = Preempt(inputs.snapshot, inputs.victims, holds=self.holds,
                          assumed=self.assumed, now=inputs.now,
                          grace_seconds=settings.preemption_grace_seconds,
                          profile=inputs.profile, explain=settings.explain)
        self.planners: tuple[Displacement, ...] = tuple(
            p for p in (preempt, self.reclaim, self.fair, self.nominate) if p is not None)

    def _trees(self) -> dict[str, str]:
        """Return the root of each tenant's quota tree: reclaim stays within a tree."""
        book = self.book
        tenants = set(self.inputs.cohorts) | {r.tenant_id for r in self.inputs.quota_rows}
        if book is None:
            return dict(self.inputs.cohorts)
        return {t: book.path(t)[-1] for t in tenants}

    def task(self, task: ClaimedTask, spec: CompiledSpec) -> None:
        """Plan one task: wait, place, or hand it back (displacing when it can)."""
        holds = self.holds
        if holds.waiting:
            waiting = holds.wait(task)
            if waiting is not None:
                if not self._holder_refused(task, spec):
                    self.unclaims.append(waiting)
                return
        if self.reclaim is not None and self._holder_refused(task, spec):
            return
        # A task holding capacity is not like the others of its fingerprint.
        held = holds.of(task.id) if holds.held else None
        reason = self.cache.get(spec) if held is None and self.unsatisfiable else None
        if reason is None:
            # A waiting preemptor's or reclaimer's need is in the book already.
            counted = self.reclaim is not None and self.reclaim.counted(task.id)
            outcome = self._decide(task, spec, held, counted)
            if outcome is None:
                return
            if outcome.members is not None:
                self._place(task, spec, outcome, held, counted)
                return
            reason = outcome.reason
            assert reason is not None  # decide gives a reason for every miss
            if held is None:
                self.cache.put(spec, reason)
                self.unsatisfiable = True
        self._fits_nowhere(Step(len(self.unclaims), task, spec, reason, held))

    def _holder_refused(self, task: ClaimedTask, spec: CompiledSpec) -> bool:
        """Hand back a reclaimer or a preemptor its quota no longer admits (its quota
        changed since it started): its holds go back in this pass and it waits for its quota
        (its need stays counted in the book until the next pass). Return whether it was
        handed back."""
        if self.reclaim is None or task.pending_code not in (PREEMPTING, RECLAIMING):
            return False
        refused = self.reclaim.refused(task.id, spec, self._book_of)
        if refused is None:
            return False
        self.holds.released.add(task.id)
        self._fits_nowhere(Step(len(self.unclaims), task, spec, refused, None))
        return True

    def _book_of(self, rows: list[QuotaRow]) -> QuotaBook:
        """Return the pass's quota book over ``rows`` in place of its tenant rows, with
        every level of the tree drawn by what they move."""
        inputs = self.inputs
        tree = cohort_rows_drawn(inputs.quota_cohorts, inputs.quota_rows, rows)
        return QuotaBook(rows, inputs.cohorts, tree, inputs.tenant_weights)

    def _decide(self, task: ClaimedTask, spec: CompiledSpec,
                held: Mapping[str, Vector] | None, counted: bool) -> Result | Ranked | None:
        try:
            outcome = decide(spec, self.inputs.snapshot, assumed=self.assumed,
                             top_k=self.top_k, explain=self.explain,
                             components=self.components,
                             holds=dict(held) if held is not None else None,
                             quotas=None if counted else self.book,
                             profile=self.inputs.profile)
        except Exception as exc:
            # One task the core cannot evaluate must not poison the batch it came in.
            log.exception("select failed for a task; parking it",
                          extra={"task_id": str(task.id)})
            self.unclaims.append(pending_unclaim(task, SCHEDULER_ERROR, error_document(
                SCHEDULER_ERROR, f"the scheduler failed on this task: {type(exc).__name__}"),
                None, now=self.inputs.now, settings=self.inputs.settings))
            return None
        if self.explain:
            self.explained[task.id] = outcome  # type: ignore[assignment]
        # Tasks of one placement class mostly share one rejection counts map: each map is
        # counted once per task here and added up at the end.
        counts = outcome.rejection_counts
        if counts:
            seen = self.counts_seen.get(id(counts))
            if seen is None:
                self.counts_seen[id(counts)] = [counts, 1]
            else:
                seen[1] += 1
        return outcome

    def _place(self, task: ClaimedTask, spec: CompiledSpec, outcome: Result | Ranked,
               held: Mapping[str, Vector] | None, counted: bool) -> None:
        members = outcome.members
        assert members is not None
        key = str(task.id)
        if held:
            # Its holds become its placement at commit: the snapshot counts them, so later
            # tasks must not see them twice (another holder on the same pool).
            self.assumed.hold(f"{key}:held", [
                (p, (-a[0], -a[1], -a[2])) for p, a in held.items()])
        if self.nominate.of:
            self.nominate.placed(task)
        self.assumed.add(spec, members, task_id=key)
        if self.book is not None and not counted:
            self.book.add(spec.tenant_id, spec.runtime_class, spec.total_requests)
        if self.shares is not None:
            self.shares.placed(spec.tenant_id, spec.runtime_class, spec.total_requests)
        self.placed.append(Placed(task, spec, outcome, tuple(members)))

    def _fits_nowhere(self, step: Step) -> None:
        reason = step.reason
        pending = _pending(step, now=self.inputs.now, settings=self.inputs.settings)
        nominee = self.nominate.nominee(step, pending)
        if nominee is not None:
            self.unclaims.append(nominee)
            return
        planned = None
        # A task over its quota displaces nothing: its own limit is what stops it.
        if reason.code not in _QUOTA_CODES and self.planners:
            self.phase("displace")
            for planner in self.planners:
                planned = planner.consider(step)
                if planned is not None:
                    break
            self.phase("plan")
        self.unclaims.append(planned or pending)

    def plan(self) -> PassPlan:
        """Settle the planners and return the plan."""
        self.phase("displace")
        settling = Settling(self.inputs, self.unclaims, self.assumed, self.holds,
                            [(p.task, p.spec) for p in self.placed])
        for planner in self.planners:
            planner.settle(settling)
        self.phase("plan")
        rejections: Counter[str] = Counter()
        for counts, times in self.counts_seen.values():
            for code, n in counts.items():
                rejections[str(code)] += n * times
        nominate = self.nominate
        return PassPlan(
            placed=tuple(self.placed), unclaims=tuple(self.unclaims),
            displaced=tuple(self.holds.grants.values()), holds=self.holds.plan(),
            nominations_ended=dict(nominate.ended),
            nominations_created=tuple(nominate.created),
            nominees_passed=tuple(nominate.passed()),
            rejections=dict(rejections), unsatisfiable_hits=self.cache.hits,
            reclaims=dict(self.reclaim.outcomes) if self.reclaim is not None else {},
            fair_reclaims=dict(self.fair.outcomes) if self.fair is not None else {},
            explained=self.explained, preemptions=self.preempt.planned,
        )


def plan_pass(inputs: PassInputs, *,
              phase: Callable[[str | None], None] = _no_phase) -> PassPlan:
    """Plan one pass: decide its tasks in policy order, then displace (see the module doc).

    ``phase`` is called with ``"displace"`` as the displacement planners start and with
    ``"plan"`` as they end (a reconciler charges its CPU counters so; nothing is timed here).
    """
    planning = _Planning(inputs, phase)
    for task, spec in fair_order(ordered_tasks(inputs), planning.book, planning.shares):
        planning.task(task, spec)
    return planning.plan()


def plan_outcomes(inputs: PassInputs) -> dict[uuid.UUID, Placed | Unclaim]:
    """Return each of the inputs' tasks' placement or hand-back, by task id (a preview's
    answer: the plan of a pass over those tasks, without its commit)."""
    plan = plan_pass(inputs)
    out: dict[uuid.UUID, Placed | Unclaim] = {p.task.id: p for p in plan.placed}
    out.update((u.task_id, u) for u in plan.unclaims)
    return out
