"""A waiting task's estimated start, by the pass's planner, in a preview worker.

The API process decides what blocks the task (its stored pending reason) and, when capacity
or its tenant's quota does, sends an :class:`EtaAsk` to a preview worker
(:mod:`app.services.offload`). The worker reads what a pass over the task would read
(:func:`eta_inputs_read`): the task and the tasks ahead of it in the order a pass claims
them (at most ``eta_tasks_max``), the snapshot (kept between previews), the quota rows and
tree of its runtime class, the holds of those tasks and the nominations; and the live leases
that could make room for it, oldest first (at most ``eta_leases_max``): on its candidate
pools (those its stored wake keys name, its nominated pools, or every pool of its class open
to its tenant that can hold one member), or for a task its quota stops, its tenant's own in
the class. :func:`eta_decide` then asks the planner (:func:`app.scheduling.eta.forecast`):
placed now, the next pass; otherwise after how many of those leases end. The leases are
spaced at the rate leases completed on the same pools (the tenant's own, for quota) over
``eta_window_seconds``.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.db import Connection
from app.ledger.nominations import nominations_read
from app.ledger.preemption import holds_read, preemptors_waiting
from app.ledger.queue import (
    leases_live_oldest,
    pools_completions_count,
    queue_task_read,
    queue_tasks_ahead,
)
from app.ledger.quotas import quota_read
from app.ledger.snapshot import (
    SnapshotCache,
    placements_grouped_read,
    snapshot_read,
    tenant_usage_read,
)
from app.ledger.tenants import tenants_entitlements
from app.pass_config import ReconcilerConfig
from app.scheduling.eta import Forecast, candidate_pools, forecast, tasks_until
from app.scheduling.explain import queue_eta
from app.scheduling.inputs import NominationInputs, PassInputs
from app.scheduling.plugins.registry import profile
from app.scheduling.records import ClaimedTask, LiveLease
from app.scheduling.spec import CompiledSpec, StoredSpecs
from app.services.offload import worker_read

__all__ = ["CAPACITY", "QUOTA", "EtaAsk", "EtaInputs", "eta_decide",
           "eta_inputs_read", "task_eta"]

#: What blocks the task an estimate is asked for.
CAPACITY = "capacity"
QUOTA = "quota"
Compiled = list[tuple[ClaimedTask, CompiledSpec]]
#: Most recent completions one estimate counts (the rate is then taken over their span).
COMPLETIONS_COUNTED = 1000


@dataclass(frozen=True, slots=True)
class EtaAsk:
    """What an estimate asks, as the API process sends it to a worker."""

    task_id: uuid.UUID
    runtime_class: str
    config: ReconcilerConfig
    now: datetime
    #: :data:`CAPACITY` or :data:`QUOTA`.
    blocker: str
    #: The pools whose leases may make room (wake keys' or nominated); None: every pool of
    #: the class open to the tenant that can hold one member.
    pool_ids: tuple[str, ...] | None = None
    nominated: bool = False
    window_seconds: float = 900.0
    leases_max: int = 32
    tasks_max: int = 50
    #: The longest a parked task waits for a pass once it fits (a pass's period).
    pass_seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class EtaInputs:
    """What an estimate decides on: a pass's inputs over the task and the tasks ahead of it,
    the live leases let end (oldest first), and the completions they are spaced by."""

    ask: EtaAsk
    inputs: PassInputs
    leases: tuple[LiveLease, ...]
    #: Candidate pools, completions over the window, and the window (seconds) they span.
    pools: int
    completed: int
    window_seconds: float
    #: More tasks ahead than an estimate plans.
    too_many_ahead: bool = False


async def _tasks_read(
    conn: Connection, ask: EtaAsk, specs: StoredSpecs
) -> tuple[Compiled, list[tuple[ClaimedTask, str]], bool] | None:
    """Return the compiled task and the tasks ahead (and those whose specs do not compile),
    and whether the bound cut the tasks read; None when the task is not ADMITTED."""
    task = await queue_task_read(conn, task_id=ask.task_id)
    if task is None:
        return None
    config = ask.config
    ahead = await queue_tasks_ahead(
        conn, runtime_class=ask.runtime_class, limit=ask.tasks_max,
        aging_seconds=config.priority_aging_seconds if config.policy == "priority" else None,
    )
    cut = len(ahead) >= ask.tasks_max
    claimed = [t for t in ahead if t.id != task.id] + [task]
    compiled, invalid = specs.compile_all(claimed)
    return compiled, invalid, cut


async def eta_inputs_read(
    conn: Connection, ask: EtaAsk, *, cache: SnapshotCache
) -> EtaInputs | None:
    """Read what the estimate of the asked task depends on, with the pools' snapshot kept in
    ``cache``; decides nothing. None: the task is no longer ADMITTED."""
    read = await _tasks_read(conn, ask, StoredSpecs(ask.tasks_max + 1))
    if read is None:
        return None
    compiled, invalid, cut = read
    mine = [spec for t, spec in compiled if t.id == ask.task_id]
    if not mine:  # its own spec does not compile: the planner says why
        compiled = []
    config, now = ask.config, ask.now
    tenants = {t.tenant_id for t, _ in compiled} | {t.tenant_id for t, _ in invalid}
    affinity = {s.tenant_id for _, s in compiled if s.required or s.preferred}
    snapshot = await snapshot_read(
        conn, now=now, freshness_seconds=config.heartbeat_freshness_seconds,
        strategy=config.strategy, cache=cache,
        placed=lambda: placements_grouped_read(conn, tenant_ids=affinity),
    )
    classes = {s.runtime_class for _, s in compiled}
    quota = await quota_read(conn, runtime_classes=classes, tenant_ids=tenants)
    fair = config.policy == "fair"
    ids = [t.id for t, _ in compiled]
    nominations = tuple(await nominations_read(conn))
    holds = await holds_read(conn, task_ids=ids) if ids else {}
    for n in nominations:
        if n.task_id in ids:
            holds.setdefault(n.task_id, {})
    inputs = PassInputs(
        now=now, settings=config.pass_settings(), profile=profile(config.strategy),
        snapshot=snapshot, tasks=tuple(compiled), invalid=tuple(invalid),
        usage=await tenant_usage_read(conn, tenant_ids=tenants) if fair else {},
        entitlements=await tenants_entitlements(conn, tenant_ids=tenants)
        if fair and quota.rows else None,
        quota_rows=quota.rows, cohorts=quota.cohorts, quota_cohorts=quota.tree,
        tenant_weights=quota.weights, holds=holds,
        waiting=await preemptors_waiting(conn, task_ids=ids) if ids else {},
        nomination=NominationInputs(nominations),
    )
    if mine:
        order = tasks_until(inputs, ask.task_id)
        inputs = dataclasses.replace(inputs, tasks=order)
        cut = cut and len(order) > ask.tasks_max
    return await _leases_read(conn, ask, inputs, too_many_ahead=cut)


async def _leases_read(
    conn: Connection, ask: EtaAsk, inputs: PassInputs, *, too_many_ahead: bool
) -> EtaInputs:
    """Return the estimate's inputs with the live leases let end and the completions."""
    spec = next((s for t, s in inputs.tasks if t.id == ask.task_id), None)
    if spec is None:
        return EtaInputs(ask, inputs, (), 0, 0, ask.window_seconds)
    quota = ask.blocker == QUOTA
    if ask.pool_ids is not None:
        pools = list(ask.pool_ids)
    elif quota:
        code = inputs.snapshot.rc_table.get(spec.runtime_class)
        seen = inputs.snapshot.by_tenant.get(spec.tenant_id)
        pools = [] if code is None or seen is None else [
            inputs.snapshot.ids[i] for i in seen[inputs.snapshot.rc[seen] == code].tolist()]
    else:
        pools = candidate_pools(inputs.snapshot, spec)
    lessee = spec.tenant_id if quota else None
    leases = await leases_live_oldest(conn, pool_ids=pools, tenant_id=lessee,
                                      limit=ask.leases_max) if pools else []
    window = ask.window_seconds
    count, completed, oldest = await pools_completions_count(
        conn, tenant_id=spec.tenant_id, runtime_class=spec.runtime_class, pool_ids=pools,
        since=ask.now - timedelta(seconds=window), limit=COMPLETIONS_COUNTED, lessee=lessee,
    ) if pools else (0, 0, None)
    if completed >= COMPLETIONS_COUNTED and oldest is not None:
        # A busy class: the rate over the span of the most recent completions (bounded read).
        window = max((ask.now - oldest).total_seconds(), 1.0)
    return EtaInputs(ask, inputs, tuple(leases), count, completed, window,
                     too_many_ahead=too_many_ahead)


def _leases_on(eta: EtaInputs) -> str:
    """Return which leases an estimate lets end, in words."""
    n = eta.pools
    if eta.ask.blocker == QUOTA:
        return "of its tenant in its runtime class"
    if eta.ask.nominated:
        return (f"on its {n} nominated pool{'' if n == 1 else 's'} (their freed capacity is "
                "held for it)")
    return f"on its {n} candidate pool{'' if n == 1 else 's'}"


def eta_decide(eta: EtaInputs) -> tuple[datetime | None, str] | None:
    """Return the estimated start of the asked task and how it was made; None for a task its
    quota stops that the planner does not place within the bound (the quota's explanation
    stands); pure."""
    ask = eta.ask
    if eta.too_many_ahead:
        return None, (
            f"no estimate: more than {ask.tasks_max} tasks are ahead of it, the most an "
            "estimate plans (BERTH_ETA_TASKS_MAX)")
    out: Forecast = forecast(eta.inputs, ask.task_id, eta.leases)
    at, words = queue_eta(
        out.ended, pool=out.pool_id, placed_ahead=out.placed_ahead, reason=out.reason,
        now=ask.now, leases_on=_leases_on(eta), completed=eta.completed,
        window_seconds=eta.window_seconds, pass_seconds=ask.pass_seconds,
        leases=len(eta.leases), leases_max=ask.leases_max, setting="BERTH_ETA_LEASES_MAX",
    )
    if ask.blocker == QUOTA:
        if at is None:
            return None  # the quota's own explanation stands
        if out.ended:
            words += " (its tenant's quota admits it then)"
    return at, words


def task_eta(ask: EtaAsk) -> tuple[datetime | None, str] | None:
    """Read and decide ``ask`` (in a preview worker, with the snapshot it keeps); None: keep
    the stored reason's explanation (see :func:`eta_decide`), or the task left the queue."""
    eta = worker_read(lambda conn, state: eta_inputs_read(
        conn, ask, cache=state.snapshot_cache(ask.config.strategy)))
    return None if eta is None else eta_decide(eta)
