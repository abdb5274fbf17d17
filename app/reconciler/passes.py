"""One reconcile pass, in one transaction: claim, snapshot, select in policy order, then apply.

1. **Claim** up to ``batch`` tasks of the owned slots: ``FOR UPDATE SKIP LOCKED`` in the
   pass's transaction, in the policy's claim order. The row locks are the claim
   (docs/decisions/0006-claims-are-row-locks.md): nothing is written to claim, and a pass
   that dies anywhere (killed, connection lost, or idle in its transaction longer than
   ``claim_ttl_seconds``, when the server ends its session) aborts and leaves nothing behind.
2. **Snapshot**: one read of ledgers and runtime health at the pass's ``now``, on top of the
   previous pass's static part (pool rows are re-read only when one changed, see
   :class:`~app.ledger.snapshot.SnapshotCache`), plus actual placements only for tenants
   whose tasks carry affinity terms, and tenant usage only under ``fair``.
3. **Select** each task with the pure core in policy order; every decision is added to an
   :class:`~app.scheduling.assumed.Assumed` overlay so later tasks see it, and specs that fit
   nowhere are remembered in the pass's :class:`UnsatisfiableCache`.
4. **Plan, then apply**: the decisions become a :class:`~app.ledger.plans.Plan` (grants with
   their pools and members; hand-backs with their reasons), and
   :func:`~app.ledger.plans.plan_apply` writes it, the ledger last. When pools refuse their
   amounts (another reconciler won the race) only the grants on those pools are undone: the
   pass re-reads the pools (it holds their rows locked now), walks the affected tasks
   (:mod:`app.reconciler.walk`, at most ``reservation_walk_limit`` candidates per task;
   gangs never walk) and leases them again with a ledger statement that skips rows other
   transactions hold (:func:`~app.ledger.plans.grants_settle`). At most
   ``commit_rounds_max`` rounds reserve; the placements still refused after the last go back
   to the queue unparked. Then the transaction commits.

A claimed task that may preempt and fits nowhere gets a preemption planned by the core; the
pass's share of that work (reads, planning, hand-backs) lives in
:mod:`app.reconciler.preempting`, and the plan applies it (in a savepoint: a preemption whose
victims changed meanwhile rolls back and its preemptor is handed back). A task within its
tenant's nominal quota that fits nowhere for capacity may reclaim borrowed capacity of its
cohort instead (:mod:`app.reconciler.reclaiming`), applied the same way.

A transient failure (serialization, deadlock, lost connection) aborts the transaction and the
whole pass is retried (see :mod:`app.reconciler.retry`); other errors propagate, the
transaction rolls back and the claimed tasks are claimable again at once. Metrics are counted
once the pass has committed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from pydantic import ValidationError

from app.db import Connection, Database
from app.ledger.claims import (
    ClaimedTask,
    claims_settings,
    tasks_claim,
    tasks_unclaim,
    tasks_unlease,
)
from app.ledger.plans import (
    ApplyResult,
    Grant,
    Plan,
    Unclaim,
    grants_quota,
    grants_settle,
    plan_apply,
)
from app.ledger.preemption import PREEMPTING
from app.ledger.quotas import QuotaPlan, QuotaRow, quota_rows_read, quota_uncharge
from app.ledger.reclaim import RECLAIMING
from app.ledger.reservations import Vector, amounts_sum
from app.ledger.snapshot import (
    LedgerRow,
    SnapshotCache,
    ledgers_read,
    placements_grouped_read,
    snapshot_read,
    tenant_usage_read,
)
from app.ledger.tenants import tenants_entitlements
from app.metrics import (
    FILTER_REJECTIONS,
    NOMINATIONS,
    PASS_DURATION,
    PLACEMENTS,
    PREEMPTION_VICTIMS,
    PREEMPTIONS,
    QUEUE_WAIT,
    RECLAIM_VICTIMS,
    RECLAIMS,
    RESERVATION_CONFLICTS,
    TASKS_CLAIMED,
    TASKS_LEASED,
    TASKS_REEXAMINED,
)
from app.reconciler.config import ReconcilerConfig
from app.reconciler.nominating import PassNomination
from app.reconciler.preempting import PassPreemption
from app.reconciler.reclaiming import PassReclaim
from app.reconciler.retry import transient_retry
from app.reconciler.walk import Decision, decisions_walk
from app.scheduling.assumed import Assumed
from app.scheduling.explain import no_placement_document
from app.scheduling.framework import decide
from app.scheduling.parking import STAGE_NONE, key_placed, pending_stage, wake_keys
from app.scheduling.plugins.quota import QuotaBook
from app.scheduling.plugins.registry import reason_plugins
from app.scheduling.policies import QueuedTask, get_policy
from app.scheduling.reasons import Reason
from app.scheduling.results import NoPlacement
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec, StoredSpecs
from app.scheduling.unsatisfiable import UnsatisfiableCache

log = logging.getLogger("berth.reconciler")

#: Event reason of a task handed back unparked after losing reservation races.
CONFLICT_REASON = "reservation_conflict"
#: Event reason and pending code of a stored spec the core cannot read.
INVALID_SPEC = "invalid_spec"
#: Event reason and pending code of a task the core raised an error on (a bug, logged).
SCHEDULER_ERROR = "scheduler_error"
#: Distinct compiled specs a reconciler keeps between passes.
COMPILED_KEPT = 4096


#: The filter plugin that emits each reason code (the label of the rejections metric).
REASON_PLUGIN = reason_plugins()


@dataclass(slots=True)
class PassResult:
    """What one pass did, counted by outcome, and how long its phases took."""

    pass_id: str
    slots: int = 0
    claimed: int = 0
    leased: int = 0
    pending: int = 0
    requeued: int = 0
    lost: int = 0
    conflicts: int = 0
    walked: int = 0
    unsatisfiable_hits: int = 0
    #: Woken tasks claimed again (silently) to be re-examined.
    reexamined: int = 0
    #: Re-examined tasks parked again without an event: still pending for the reason their
    #: log last recorded, or for another one within a park sweep period of that record.
    unchanged: int = 0
    #: Parked tasks the pass's placements unparked (affinity now has a match).
    woken: int = 0
    commit_rounds: int = 0
    #: Pools that refused a reservation round (``stage="reserve"`` of the conflicts metric).
    refused_pools: int = 0
    #: Preemptions committed (their victims are revoking now).
    preempting: int = 0
    #: Reclaims by outcome (app.reconciler.reclaiming), and their victims committed.
    reclaims: Counter[str] = field(default_factory=Counter)
    reclaim_victims: int = 0
    #: Whether the pass re-read the pool rows (a pool changed) instead of reusing them.
    snapshot_rebuilt: bool = False
    duration_seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    leased_ids: list[uuid.UUID] = field(default_factory=list)
    #: Filter rejections by reason code, and the queue wait of each task leased: counted in
    #: the metrics once the pass has committed.
    rejections: Counter[str] = field(default_factory=Counter)
    queue_waits: list[float] = field(default_factory=list)
    victims: int = 0
    #: Nominations started (``nominated``) and ended (by outcome) by the pass.
    nominations: Counter[str] = field(default_factory=Counter)

    def to_log(self) -> dict[str, Any]:
        """Return the result as flat log fields."""
        return {
            "pass_id": self.pass_id,
            "slots": self.slots,
            "claimed": self.claimed,
            "leased": self.leased,
            "pending": self.pending,
            "requeued": self.requeued,
            "lost": self.lost,
            "conflicts": self.conflicts,
            "walked": self.walked,
            "unsatisfiable_hits": self.unsatisfiable_hits,
            "reexamined": self.reexamined,
            "unchanged": self.unchanged,
            "woken": self.woken,
            "preempting": self.preempting,
            **({"nominations": dict(self.nominations)} if self.nominations else {}),
            "snapshot_rebuilt": self.snapshot_rebuilt,
            "duration_ms": round(self.duration_seconds * 1000, 2),
            **{f"{k}_ms": round(v * 1000, 2) for k, v in self.phases.items()},
        }


def pending_logged(task: ClaimedTask, code: str, *, now: datetime, period: float) -> bool:
    """Return whether handing ``task`` back pending for ``code`` writes an event.

    A first examination always does, and so does the end of a preemptor's wait (its
    preemption is over: not a flap). A re-examination does only when ``code`` differs from
    the code the task's event log last recorded, and that record is at least ``period``
    seconds old: a pool whose health flaps changes the reason of every task parked on it
    back and forth, and each task then logs at most one change per period. Its pending
    reason is the latest at once; the log catches up at a later re-examination (the safety
    sweep re-examines every parked task about once a period).
    """
    if task.pending_code is None or task.pending_code in (PREEMPTING, RECLAIMING):
        return True
    logged = task.logged_code if task.logged_code is not None else task.pending_code
    if code == logged:
        return False
    return task.logged_at is None or (now - task.logged_at).total_seconds() >= period


def _pending(
    task: ClaimedTask, code: str, document: Mapping[str, Any], wake: tuple[str, ...] | None,
    *, now: datetime, period: float, keep: int,
) -> Unclaim:
    """Return the parking hand-back of a task pending for ``code``, with an event only when
    :func:`pending_logged` says so (a re-examination that finds the same reason leaves the
    history alone); an event past the task's ``keep`` pending events trims its log to the
    first event and the latest ``keep``."""
    event = pending_logged(task, code, now=now, period=period)
    return Unclaim(
        task.id, code, document, parked=True, wake=wake,
        stage=pending_stage(code) if wake is not None else STAGE_NONE,
        event=event, trim_to=keep if event and task.logged_count >= keep else None,
    )


def _scaled(requests: tuple[int, int, int], members: int) -> tuple[int, int, int]:
    return (requests[0] * members, requests[1] * members, requests[2] * members)


@dataclass(slots=True)
class PassContext:
    """What a pass needs from its reconciler: the database, config, owner and retry hooks."""

    db: Database
    config: ReconcilerConfig
    slots: frozenset[int]
    rng: Callable[[], float]
    sleep: Callable[[float], Awaitable[object]]
    #: The wall clock for commit times; None pins every time of the pass to its ``now``.
    clock: Callable[[], datetime] | None = None
    #: A number that changes every pass (the fair claim's starting slot rotates with it).
    rotation: int = 0
    #: The previous pass's snapshot, whose static part is reused while no pool row changed.
    snapshot_cache: SnapshotCache = field(default_factory=SnapshotCache)
    #: Compiled specs by spec text, validated once per spec class, kept across passes.
    compiled: StoredSpecs = field(default_factory=lambda: StoredSpecs(COMPILED_KEPT))
    #: What every pass runs inside (``berth reconcile``: the collector paused, see
    #: :mod:`app.gc_tuning`); nothing by default.
    pass_guard: Callable[[], AbstractContextManager[object]] = nullcontext

    def compile(self, task: ClaimedTask) -> CompiledSpec:
        """Return the task's compiled spec (see :class:`StoredSpecs`).

        The compiled spec is shared by every task of the same tenant and spec text, so its
        ``task_id`` is unset: the pass names the task where it matters (``Assumed.add``).
        """
        return self.compiled.compile(task.tenant_id, task.spec_json)

    async def retry(self, operation: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Run a transaction with the configured transient-failure retries."""
        return await transient_retry(
            operation,
            attempts=self.config.retry_attempts,
            base_seconds=self.config.retry_base_delay_seconds,
            max_seconds=self.config.retry_max_delay_seconds,
            what=what,
            rng=self.rng,
            sleep=self.sleep,
        )


async def pass_run(ctx: PassContext, *, pass_id: str, now: datetime) -> PassResult:
    """Run one pass at ``now`` in one transaction (retried whole on a transient failure)
    and return what it did."""
    started = time.perf_counter()

    async def attempt() -> PassResult:
        async with ctx.db.transaction() as conn:
            # A pass that hangs holding its claims is ended by the server (and rolled back).
            await claims_settings(conn, idle_seconds=ctx.config.claim_ttl_seconds)
            return await _pass_in(conn, ctx, pass_id=pass_id, now=now)

    with ctx.pass_guard():
        result: PassResult = await ctx.retry(attempt, "pass")
    _metrics_count(result)
    result.duration_seconds = time.perf_counter() - started
    if result.claimed:
        PASS_DURATION.observe(result.duration_seconds)
    return result


def _metrics_count(result: PassResult) -> None:
    """Count a committed pass in the metrics."""
    if not result.claimed:
        return
    # Re-examinations are not claims in the metric's sense: it grows with new work only.
    TASKS_CLAIMED.inc(result.claimed - result.reexamined)
    TASKS_REEXAMINED.inc(result.reexamined)
    for label, n in result.rejections.items():
        FILTER_REJECTIONS.labels(plugin=REASON_PLUGIN.get(label, "core"), reason=label).inc(n)
    if result.refused_pools:
        RESERVATION_CONFLICTS.labels(stage="reserve").inc(result.refused_pools)
    if result.conflicts > result.refused_pools:
        RESERVATION_CONFLICTS.labels(stage="preempt").inc(result.conflicts - result.refused_pools)
    if result.preempting:
        PREEMPTIONS.inc(result.preempting)
        PREEMPTION_VICTIMS.labels(outcome="revoking").inc(result.victims)
    for outcome, n in result.reclaims.items():
        RECLAIMS.labels(outcome=outcome).inc(n)
    if result.reclaim_victims:
        RECLAIM_VICTIMS.inc(result.reclaim_victims)
    for outcome, n in result.nominations.items():
        NOMINATIONS.labels(outcome=outcome).inc(n)
    TASKS_LEASED.inc(result.leased)
    PLACEMENTS.labels(outcome="leased").inc(result.leased)
    # A re-examination that changed nothing is not a new decision.
    PLACEMENTS.labels(outcome="pending").inc(result.pending - result.unchanged)
    PLACEMENTS.labels(outcome="conflict").inc(result.requeued)
    for wait in result.queue_waits:
        QUEUE_WAIT.observe(wait)


def queued_task(
    key: str, tenant_id: str, priority: int, seq: int, admitted_at: datetime, spec: CompiledSpec
) -> QueuedTask:
    """Return a task as the policy sees it (a gang asks for all its members' requests)."""
    requests = spec.requests if spec.members == 1 else _scaled(spec.requests, spec.members)
    return QueuedTask(key, tenant_id, priority, seq, admitted_at.timestamp(), requests)


def queue_order(
    cfg: ReconcilerConfig,
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
        {"aging_seconds": cfg.priority_aging_seconds} if cfg.policy == "priority" else {}
    )
    if cfg.policy == "fair" and entitlements:
        options["entitlements"] = entitlements
    policy = get_policy(cfg.policy, **options)
    total = snapshot.cap.sum(axis=0) if snapshot.n else (0, 0, 0)
    capacity = (int(total[0]), int(total[1]), int(total[2]))
    return policy.order(
        queued, now=now.timestamp(), tenant_usage=usage, cluster_capacity=capacity
    )


async def _pass_in(
    conn: Connection, ctx: PassContext, *, pass_id: str, now: datetime
) -> PassResult:
    """Run one pass in the transaction of ``conn``; return what it did."""
    cfg = ctx.config
    t0 = time.perf_counter()
    result = PassResult(pass_id=pass_id, slots=len(ctx.slots))
    phases = result.phases
    claimed = await tasks_claim(
        conn,
        slots=ctx.slots,
        batch=cfg.batch_size,
        now=now,
        policy=cfg.policy,
        aging_seconds=cfg.priority_aging_seconds,
        fair_rotation=ctx.rotation,
    )
    phases["claim"] = time.perf_counter() - t0
    result.claimed = len(claimed)
    if not claimed:
        return result
    result.reexamined = sum(1 for t in claimed if t.pending_code is not None)

    # Each claimed task whose spec compiles, with its spec, in claim order.
    compiled: list[tuple[ClaimedTask, CompiledSpec]] = []
    unclaims: list[Unclaim] = []
    compile_, add = ctx.compile, compiled.append
    for task in claimed:
        try:
            add((task, compile_(task)))
        except (ValidationError, ValueError, TypeError) as exc:
            unclaims.append(_pending(task, INVALID_SPEC, {
                "code": INVALID_SPEC,
                "message": f"stored spec cannot be read: {str(exc).splitlines()[0][:200]}",
                "rejections": {},
            }, None, now=now, period=cfg.park_sweep_seconds, keep=cfg.task_events_kept))
    affinity_tenants = {
        spec.tenant_id for _, spec in compiled if spec.required or spec.preferred
    }
    tenants = {t.tenant_id for t in claimed}
    preemption = PassPreemption(grace_seconds=cfg.preemption_grace_seconds)

    t0 = time.perf_counter()

    rebuilds = ctx.snapshot_cache.rebuilds
    snapshot = await snapshot_read(
        conn, now=now, freshness_seconds=cfg.heartbeat_freshness_seconds,
        strategy=cfg.strategy,
        placed=lambda: placements_grouped_read(conn, tenant_ids=affinity_tenants),
        cache=ctx.snapshot_cache,
    )
    usage = await tenant_usage_read(conn, tenant_ids=tenants) if cfg.policy == "fair" else {}
    quota_rows, cohorts = await quota_rows_read(
        conn, runtime_classes={spec.runtime_class for _, spec in compiled}, tenant_ids=tenants
    )
    reclaim = PassReclaim(
        rows=quota_rows, cohorts=cohorts, grace_seconds=cfg.preemption_grace_seconds,
        min_runtime_seconds=cfg.reclaim_min_runtime_seconds,
    ) if quota_rows else None
    if reclaim is not None:
        await reclaim.load(conn)
        quota_rows = reclaim.quota_rows()
    book = QuotaBook(quota_rows, cohorts) if quota_rows else None
    await preemption.load(conn, claimed=compiled)
    nomination = PassNomination(seconds=cfg.nomination_seconds, now=now,
                                by_priority=cfg.policy == "priority")
    await nomination.load(conn, claimed=compiled, preemption=preemption)
    result.snapshot_rebuilt = ctx.snapshot_cache.rebuilds != rebuilds
    phases["snapshot"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    entitlements = (
        await tenants_entitlements(conn, tenant_ids=tenants)
        if cfg.policy == "fair" and quota_rows else None
    )
    # Each claimed task with a spec by its id as text, then as the policy sees it.
    by_id = {str(t.id): (t, spec) for t, spec in compiled}
    ordered = queue_order(
        cfg,
        [queued_task(key, t.tenant_id, t.priority, t.seq, t.admitted_at, spec)
         for key, (t, spec) in by_id.items()],
        snapshot=snapshot, usage=usage, now=now, entitlements=entitlements,
    )

    assumed = Assumed(snapshot)
    cache = UnsatisfiableCache(assumed)
    decisions: list[Decision] = []
    # Bound once: the loop runs once per claimed task. The preemptors' waits and the cache
    # of specs that fit nowhere are only asked once they hold something.
    waiting_of = preemption.waiting if preemption.waits else None
    holds, cached = preemption.holds, cache.get
    assume, decided = assumed.add, decisions.append
    top_k, period, keep = cfg.top_k, cfg.park_sweep_seconds, cfg.task_events_kept
    unsatisfiable = False
    nominating, nominees = nomination.on, nomination.nominees
    # The rejection counts maps of the pass's outcomes, by identity (kept alive here, so an
    # id is never reused), with how many tasks had each.
    counts_seen: dict[int, list] = {}
    for q in ordered:
        task, spec = by_id[q.task_id]
        if waiting_of is not None:
            waiting = waiting_of(task)
            if waiting is not None:
                unclaims.append(waiting)
                continue
        # A task holding nominated capacity is not like the others of its fingerprint.
        held = holds.get(task.id) if holds else None
        reason = cached(spec) if held is None and unsatisfiable else None
        if reason is None:
            # A waiting reclaimer's need is in the book already (app.reconciler.reclaiming).
            quotas = None if reclaim is not None and reclaim.counted(task.id) else book
            try:
                outcome = decide(spec, snapshot, assumed=assumed, top_k=top_k, holds=held,
                                 quotas=quotas)
            except Exception as exc:
                # One task the core cannot evaluate must not poison the batch it came in.
                log.exception("select failed for a task; parking it",
                              extra={"pass_id": pass_id, "task_id": str(task.id)})
                unclaims.append(_pending(task, SCHEDULER_ERROR, {
                    "code": SCHEDULER_ERROR,
                    "message": f"the scheduler failed on this task: {type(exc).__name__}",
                    "rejections": {},
                }, None, now=now, period=cfg.park_sweep_seconds, keep=cfg.task_events_kept))
                continue
            # Tasks of one placement class mostly share one rejection counts map: each map
            # is counted once per task here and added up after the loop.
            counts = outcome.rejection_counts
            if counts:
                seen = counts_seen.get(id(counts))
                if seen is None:
                    counts_seen[id(counts)] = [counts, 1]
                else:
                    seen[1] += 1
            members = outcome.members
            if members is not None:
                if held:
                    # Its holds become its placement at commit: the snapshot counts them, so
                    # later tasks must not see them twice (another holder on the same pool).
                    assumed.hold(f"{q.task_id}:held", [
                        (p, (-a[0], -a[1], -a[2])) for p, a in held.items()])
                if nominees:
                    nomination.placed(task)
                assume(spec, members, task_id=q.task_id)
                if quotas is not None:
                    quotas.add(spec.tenant_id, spec.runtime_class, spec.total_requests)
                decided(Decision(task, spec, outcome, members))
                continue
            reason = outcome.reason or NoPlacement(Reason.TENANT_NOT_ALLOWED, "no pool fits")
            if held is None:
                cache.put(spec, reason)
                unsatisfiable = True
        if nominees and task.id in nomination.of:
            unclaims.append(nomination.nominee(task, reason, partial(
                _pending, task, str(reason.code), no_placement_document(reason),
                wake_keys(spec, reason), now=now, period=period, keep=keep,
            ), len(unclaims)))
            continue
        # A task over its quota displaces nothing: its own limit is what stops it.
        over_quota = reason.code in _QUOTA_CODES
        preempting = None if over_quota else preemption.plan(
            task, spec, reason, snapshot=snapshot, assumed=assumed, now=now)
        if preempting is None and reclaim is not None:
            reclaim.consider(len(unclaims), task, spec, reason, held)
        if preempting is None and nominating and not over_quota:
            nomination.consider(task, spec, reason, len(unclaims))
        unclaims.append(preempting or _pending(
            task, str(reason.code), no_placement_document(reason), wake_keys(spec, reason),
            now=now, period=period, keep=keep,
        ))
    rejections = result.rejections
    for counts, times in counts_seen.values():
        for code, n in counts.items():
            rejections[str(code)] += n * times
    result.unsatisfiable_hits = cache.hits
    if reclaim is not None:
        await reclaim.plan(
            conn, unclaims, snapshot=snapshot, assumed=assumed,
            placed=[d.spec for d in decisions if not reclaim.counted(d.task.id)],
            grants=preemption.grants, taken=preemption.taken, now=now,
        )
    # After the reclaims: a task with a reclaim's grant is not nominated.
    if nominating:
        await nomination.settle(conn, unclaims=unclaims, snapshot=snapshot, assumed=assumed,
                                preemption=preemption, placed=(d.task.id for d in decisions))
    phases["select"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    quota = _quota_plan(decisions, quota_rows) if quota_rows else None
    await _plan_commit(conn, ctx, result, decisions, unclaims, snapshot, preemption, quota,
                       nomination, now=now)
    if reclaim is not None:
        _reclaims_count(result, reclaim, preemption)
    phases["commit"] = time.perf_counter() - t0
    return result


_QUOTA_CODES = (Reason.QUOTA_EXCEEDED, Reason.QUOTA_BORROW_UNAVAILABLE)


def _reclaims_count(result: PassResult, reclaim: PassReclaim, preemption: PassPreemption) -> None:
    """Count the pass's reclaims by outcome, apart from its preemptions."""
    result.reclaims.update(reclaim.outcomes)
    started = [t for t in reclaim.planned if t in preemption.grants]
    if started:
        result.reclaims["started"] += len(started)
        result.reclaim_victims = sum(len(preemption.grants[t].victims) for t in started)
        result.preempting -= len(started)
        result.victims -= result.reclaim_victims
    if len(started) < len(reclaim.planned):
        result.reclaims["conflict"] += len(reclaim.planned) - len(started)


def _quota_plan(decisions: list[Decision], rows: list[QuotaRow]) -> QuotaPlan:
    """Return the quota charges of ``decisions``: those in managed runtime classes."""
    managed: dict[str, set[str]] = {}
    for r in rows:
        managed.setdefault(r.runtime_class, set()).add(r.resource)
    return QuotaPlan(
        of={d.task.id: (d.spec.tenant_id, d.spec.runtime_class) for d in decisions
            if d.spec.runtime_class in managed},
        managed={rc: frozenset(res) for rc, res in managed.items()},
        rows=frozenset((r.tenant_id, r.runtime_class, r.resource) for r in rows),
    )


def _grants(decisions: list[Decision], instance: dict[str, str]) -> list[Grant]:
    """Return the grants of ``decisions`` (their members on the pools' runtime instances),
    each with its placement's stored text."""
    grants: list[Grant] = []
    for d in decisions:
        spec = d.spec
        on = tuple((p, c, instance[p]) for p, c in d.members)
        wakes = (key_placed(spec.tenant_id),) if spec.labels else ()
        grants.append(Grant(d.task.id, d.placement_text(), on, spec.requests, wakes))
    return grants


def _plan(
    decisions: list[Decision],
    unclaims: list[Unclaim],
    instance: dict[str, str],
    preemption: PassPreemption,
    quota: QuotaPlan | None,
) -> Plan:
    """Return the plan of the decisions, the hand-backs and the preemptions."""
    return Plan(
        grants=tuple(_grants(decisions, instance)),
        unclaims=tuple(unclaims),
        preemptions=tuple(preemption.grants.values()),
        holds_taken=preemption.holds_taken((d.task.id for d in decisions), unclaims),
        quota=quota,
    )


def _members_amounts(
    decisions: list[Decision], *, skip: frozenset[str]
) -> dict[str, Vector]:
    """Return what the members of ``decisions`` on pools other than ``skip`` reserve."""
    return amounts_sum(
        (p, c * d.spec.requests[0], c * d.spec.requests[1], c * d.spec.requests[2])
        for d in decisions for p, c in d.members if p not in skip
    )


async def _plan_commit(
    conn: Connection,
    ctx: PassContext,
    result: PassResult,
    decisions: list[Decision],
    unclaims: list[Unclaim],
    snapshot: Snapshot,
    preemption: PassPreemption,
    quota: QuotaPlan | None,
    nomination: PassNomination,
    *,
    now: datetime,
) -> None:
    """Apply the pass's plan in its transaction, settling the grants whose pools refused in
    at most ``commit_rounds_max`` reserving rounds; fill ``result``."""
    cfg = ctx.config
    ttl = cfg.lease_ttl_seconds
    instance = snapshot.instance_of
    # Leases and leased_at carry the commit's time, not the pass start.
    commit_now = ctx.clock() if ctx.clock is not None else now
    while True:
        result.commit_rounds += 1
        plan = _plan(decisions, unclaims, instance, preemption, quota)
        applied: ApplyResult = await plan_apply(
            conn, plan=plan, now=commit_now, lease_ttl_seconds=ttl
        )
        if not applied.lost_preemptions:
            break
        # A victim ended or was taken meanwhile, or a hold was refused: those preemptors go
        # back to the queue (the savepoint undid the whole plan: apply it again without).
        result.conflicts += len(applied.lost_preemptions)
        preemption.drop(applied.lost_preemptions, unclaims)
        nomination.dropped(applied.lost_preemptions)

    events = dict(applied.leased)
    # Placements their tenant's quota refused at commit (another pass charged first) hold
    # nothing: their leases are undone and they go back to the queue with the lost races.
    refused_quota = [d for d in decisions if d.task.id in applied.quota_refused]
    if refused_quota:
        await tasks_unlease(conn, tasks=[d.task for d in refused_quota], events=events,
                            now=commit_now)
        for d in refused_quota:
            del events[d.task.id]
        result.conflicts += len(refused_quota)
    kept = [d for d in decisions if d.task.id in events]
    # The grants of the last ledger statement: only they can be refused by it (the amounts
    # of earlier rounds' grants are in the ledger already).
    last = kept
    released: list[Decision] = []
    refused = applied.refused
    # Holds given back on refused pools: their rows are gone, so their amounts must go too.
    release_first: dict[str, Vector] = dict(applied.taken_refused)
    # Pools a later round's statement refused: it skips rows other transactions hold, and
    # a fresh read of such a row does not show that it is held, so the walk counts them full.
    blocked: set[str] = set()
    while refused:
        result.conflicts += len(refused)
        result.refused_pools += len(refused)
        hit = [d for d in last if any(p in refused for p, _ in d.members)]
        undone = {id(d) for d in hit}
        kept = [d for d in kept if id(d) not in undone]
        # The members of a refused grant on pools that accepted (a gang's) were reserved.
        release = amounts_sum((p, *a) for m in (
            release_first, _members_amounts(hit, skip=refused)
        ) for p, a in m.items())
        release_first = {}
        walked: list[Decision] = []
        if result.commit_rounds < cfg.commit_rounds_max:
            result.commit_rounds += 1
            pools = set(refused) | {c.pool_id for d in hit for c in d.result.candidates}
            fresh = await ledgers_read(conn, pool_ids=pools)
            for pool_id in blocked & fresh.keys():
                fresh[pool_id] = LedgerRow(fresh[pool_id].total, fresh[pool_id].total)
            walks_before = sum(d.walks for d in hit)
            walked, dropped = decisions_walk(
                hit, fresh=fresh, snapshot=snapshot, walk_limit=cfg.reservation_walk_limit
            )
            result.walked += sum(d.walks for d in hit) - walks_before
        else:
            dropped = hit
        released += dropped
        leased, refused = await grants_settle(
            conn, undo=[d.task for d in hit], events=events, release=release,
            grants=_grants(walked, instance), now=commit_now, lease_ttl_seconds=ttl,
        )
        blocked |= refused
        events.update(leased)
        last = [d for d in walked if d.task.id in leased]
        released += [d for d in walked if d.task.id not in leased]
        kept += last

    if quota is not None and released:
        # Charged at the first apply, placed nowhere in the end: their quota goes back.
        await quota_uncharge(conn, amounts=quota.amounts(grants_quota(
            _grants(released, instance))))
    released += refused_quota
    # The placements refused in every round go back to the queue, unparked.
    await tasks_unclaim(conn, items=[
        Unclaim(d.task.id, CONFLICT_REASON, None, parked=False) for d in released
    ], now=commit_now)

    unclaimed = applied.unclaimed
    result.leased = len(kept)
    result.leased_ids = [d.task.id for d in kept]
    result.pending = sum(1 for u in unclaims if u.task_id in unclaimed)
    result.unchanged = sum(1 for u in unclaims if u.task_id in unclaimed and not u.event)
    result.woken = applied.woken
    result.requeued = len(released)
    # A nomination is applied as a preemption without victims: not counted as one.
    result.preempting = len(applied.preempted - nomination.created)
    result.nominations = nomination.outcomes
    result.victims = sum(len(preemption.grants[t].victims) for t in applied.preempted)
    result.queue_waits = [
        max((commit_now - d.task.admitted_at).total_seconds(), 0.0) for d in kept
    ]
    if log.isEnabledFor(logging.DEBUG):
        for d in kept:
            log.debug(
                "task leased",
                extra={"pass_id": result.pass_id, "task_id": str(d.task.id),
                       "pool_id": d.members[0][0], "walks": d.walks},
            )
