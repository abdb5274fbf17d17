"""One reconcile pass, in one transaction: claim, then read -> plan -> commit.

1. **Claim** up to ``batch`` tasks of the owned slots: ``FOR UPDATE SKIP LOCKED`` in the
   pass's transaction, in the policy's claim order. The row locks are the claim
   (docs/decisions/0006-claims-are-row-locks.md): nothing is written to claim, and a pass
   that dies anywhere (killed, connection lost, or idle in its transaction longer than
   ``claim_ttl_seconds``, when the server ends its session) aborts and leaves nothing behind.
2. **Read** (:mod:`app.reconciler.reading`): one immutable
   :class:`~app.scheduling.inputs.PassInputs` (snapshot, tasks, quota rows, holds,
   displacements under way, nominations, the settings that decide, ``now``).
3. **Plan** (:func:`app.scheduling.planner.plan_pass`): pure and deterministic: decide each
   task in policy order, assume, charge quota, cache specs that fit nowhere, then the
   displacement planners (preempt, reclaim, fair-share reclaim, nominate).
4. **Commit** (:mod:`app.reconciler.committing`): apply the plan through the ledger, the
   only writer; lost races are walked to other candidates, lost displacements dropped.

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
from typing import Any

from app.cpu_phases import CpuPhases, cpu_phases_installed
from app.db import Connection, Database
from app.ledger.claims import claims_settings, tasks_claim
from app.ledger.snapshot import SnapshotCache
from app.metrics import (
    FAIR_SHARE_RECLAIM_VICTIMS,
    FAIR_SHARE_RECLAIMS,
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
from app.pass_config import ReconcilerConfig
from app.reconciler.committing import Committed, pass_commit
from app.reconciler.reading import pass_read
from app.reconciler.recording import Recorder
from app.reconciler.retry import transient_retry
from app.scheduling.planner import plan_pass
from app.scheduling.plugins.registry import reason_plugins
from app.scheduling.records import Kind
from app.scheduling.spec import StoredSpecs

log = logging.getLogger("berth.reconciler")

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
    #: Displacements lost to a race, and placements their quota refused at commit.
    displacement_conflicts: int = 0
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
    #: Fair-share reclaims by outcome, and their victims committed.
    fair_reclaims: Counter[str] = field(default_factory=Counter)
    fair_reclaim_victims: int = 0
    #: Whether the pass re-read the pool rows (a pool changed) instead of reusing them.
    snapshot_rebuilt: bool = False
    duration_seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    #: The reconciler thread's CPU seconds by phase of the pass (:mod:`app.cpu_phases`):
    #: claim, read, plan, displace, commit_build, commit, record.
    cpu: dict[str, float] = field(default_factory=dict)
    leased_ids: list[uuid.UUID] = field(default_factory=list)
    #: Filter rejections by reason code, and the queue wait of each task leased: counted in
    #: the metrics once the pass has committed.
    rejections: Counter[str] = field(default_factory=Counter)
    queue_waits: list[float] = field(default_factory=list)
    victims: int = 0
    #: Nominations started (``nominated``) and ended (by outcome) by the pass.
    nominations: Counter[str] = field(default_factory=Counter)
    #: Bytes the pass's record stored (0: not recorded).
    recorded_bytes: int = 0

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
            **{f"cpu_{k}_ms": round(v * 1000, 3) for k, v in self.cpu.items()},
        }


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
    #: Records each committed pass (None: passes are not recorded).
    recorder: Recorder | None = None

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
    if result.displacement_conflicts:
        RESERVATION_CONFLICTS.labels(stage="preempt").inc(result.displacement_conflicts)
    if result.preempting:
        PREEMPTIONS.inc(result.preempting)
        PREEMPTION_VICTIMS.labels(outcome="revoking").inc(result.victims)
    for outcome, n in result.reclaims.items():
        RECLAIMS.labels(outcome=outcome).inc(n)
    if result.reclaim_victims:
        RECLAIM_VICTIMS.inc(result.reclaim_victims)
    for outcome, n in result.fair_reclaims.items():
        FAIR_SHARE_RECLAIMS.labels(outcome=outcome).inc(n)
    if result.fair_reclaim_victims:
        FAIR_SHARE_RECLAIM_VICTIMS.inc(result.fair_reclaim_victims)
    for outcome, n in result.nominations.items():
        NOMINATIONS.labels(outcome=outcome).inc(n)
    TASKS_LEASED.inc(result.leased)
    PLACEMENTS.labels(outcome="leased").inc(result.leased)
    # A re-examination that changed nothing is not a new decision.
    PLACEMENTS.labels(outcome="pending").inc(result.pending - result.unchanged)
    PLACEMENTS.labels(outcome="conflict").inc(result.requeued)
    for wait in result.queue_waits:
        QUEUE_WAIT.observe(wait)


async def _pass_in(
    conn: Connection, ctx: PassContext, *, pass_id: str, now: datetime
) -> PassResult:
    """Run one pass in the transaction of ``conn``: claim, read, plan, commit."""
    result = PassResult(pass_id=pass_id, slots=len(ctx.slots))
    cpu = CpuPhases()
    with cpu_phases_installed(cpu):
        await _pass_phases(conn, ctx, result, cpu, now=now)
    result.cpu = cpu.seconds
    return result


async def _pass_phases(conn: Connection, ctx: PassContext, result: PassResult, cpu: CpuPhases,
                       *, now: datetime) -> None:
    """Claim, read, plan and commit into ``result``, switching ``cpu`` at each phase."""
    cfg = ctx.config
    phases = result.phases
    cpu.switch("claim")
    t0 = time.perf_counter()
    claimed = await tasks_claim(
        conn, slots=ctx.slots, batch=cfg.batch_size, now=now, policy=cfg.policy,
        aging_seconds=cfg.priority_aging_seconds, fair_rotation=ctx.rotation,
    )
    phases["claim"] = time.perf_counter() - t0
    result.claimed = len(claimed)
    if not claimed:
        return
    result.reexamined = sum(1 for t in claimed if t.pending_code is not None)

    cpu.switch("read")
    t0 = time.perf_counter()
    rebuilds = ctx.snapshot_cache.rebuilds
    inputs = await pass_read(conn, config=cfg, claimed=claimed, specs=ctx.compiled,
                             cache=ctx.snapshot_cache, now=now)
    result.snapshot_rebuilt = ctx.snapshot_cache.rebuilds != rebuilds
    phases["snapshot"] = time.perf_counter() - t0

    cpu.switch("plan")
    t0 = time.perf_counter()
    plan = plan_pass(inputs, phase=cpu.switch)
    result.rejections.update(plan.rejections)
    result.unsatisfiable_hits = plan.unsatisfiable_hits
    phases["select"] = time.perf_counter() - t0

    cpu.switch("commit")
    t0 = time.perf_counter()
    # Leases and leased_at carry the commit's time, not the pass start.
    commit_now = ctx.clock() if ctx.clock is not None else now
    committed = await pass_commit(conn, plan=plan, inputs=inputs, config=cfg, now=commit_now)
    if ctx.recorder is not None:
        cpu.switch("record")
        result.recorded_bytes = await ctx.recorder.record(
            conn, pass_id=result.pass_id, inputs=inputs, plan=plan)
        cpu.switch("commit")
    _result_fill(result, committed, plan.reclaims, now=commit_now)
    _fair_fill(result, committed, plan.fair_reclaims)
    phases["commit"] = time.perf_counter() - t0


def _fair_fill(
    result: PassResult, committed: Committed, outcomes: Mapping[str, int]
) -> None:
    """Count the pass's fair-share reclaims by outcome, and their victims."""
    result.fair_reclaims.update(outcomes)
    fair = committed.displaced.get(Kind.FAIR_SHARE, [])
    if fair:
        result.fair_reclaims["started"] += len(fair)
        result.fair_reclaim_victims = sum(len(g.victims) for g in fair)
    if committed.lost.get(Kind.FAIR_SHARE):
        result.fair_reclaims["conflict"] += committed.lost[Kind.FAIR_SHARE]


def _result_fill(
    result: PassResult, committed: Committed, reclaims: Mapping[str, int], *, now: datetime
) -> None:
    """Fill ``result`` with what the commit wrote, displacements counted by kind."""
    kept = committed.leased
    result.leased = len(kept)
    result.leased_ids = [d.task.id for d in kept]
    result.pending = committed.pending
    result.unchanged = committed.unchanged
    result.woken = committed.woken
    result.requeued = len(committed.released)
    result.commit_rounds = committed.rounds
    result.walked = committed.walked
    result.refused_pools = committed.refused_pools
    result.displacement_conflicts = committed.displacement_conflicts + committed.quota_conflicts
    result.conflicts = committed.refused_pools + result.displacement_conflicts
    preempted = committed.displaced.get(Kind.PREEMPT, [])
    result.preempting = len(preempted)
    result.victims = sum(len(g.victims) for g in preempted)
    reclaimed = committed.displaced.get(Kind.RECLAIM, [])
    result.reclaims.update(reclaims)
    if reclaimed:
        result.reclaims["started"] += len(reclaimed)
        result.reclaim_victims = sum(len(g.victims) for g in reclaimed)
    if committed.lost.get(Kind.RECLAIM):
        result.reclaims["conflict"] += committed.lost[Kind.RECLAIM]
    result.nominations = committed.nominations
    result.queue_waits = [
        max((now - d.task.admitted_at).total_seconds(), 0.0) for d in kept
    ]
    if log.isEnabledFor(logging.DEBUG):
        for d in kept:
            log.debug(
                "task leased",
                extra={"pass_id": result.pass_id, "task_id": str(d.task.id),
                       "pool_id": d.members[0][0], "walks": d.walks},
            )
