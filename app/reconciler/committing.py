"""The commit phase of a pass: apply its :class:`~app.scheduling.planner.PassPlan` through the
ledger, the only writer, in the pass's transaction.

1. **Nominations** first: nominees the plan passed are released (when no other pass holds
   them), new nominations are recorded (one whose pool another pass nominated first is
   dropped: its task is handed back as it would have been without), ended ones deleted
   with an event each.
2. **The plan**: :func:`~app.ledger.plans.plan_apply` writes grants, hand-backs,
   displacements and holds given back, the ledger last. A displacement whose victims
   changed meanwhile (or whose hold a pool refused) rolls the plan back: its task goes back
   to the queue unparked and the plan is applied again without it.
3. **Lost races**: when pools refuse their amounts (another reconciler won) only the grants
   on those pools are undone: the pass re-reads those pools (it holds their rows locked
   now), walks the affected tasks (:mod:`app.reconciler.walk`, at most
   ``reservation_walk_limit`` candidates per task; gangs never walk) and leases them again
   with a statement that skips rows other transactions hold. At most ``commit_rounds_max``
   rounds reserve; the placements still refused after the last go back to the queue
   unparked, and placements their tenant's quota refused (another pass charged first) too.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from app.cpu_phases import cpu_phase
from app.db import Connection
from app.ledger.claims import tasks_unclaim, tasks_unlease
from app.ledger.events import task_events_add
from app.ledger.nominations import (
    NOMINATION_ENDED,
    nominations_delete,
    nominations_insert,
    nominees_release,
)
from app.ledger.plans import ApplyResult, Grant, Plan, grants_quota, grants_settle, plan_apply
from app.ledger.quotas import QuotaPlan, quota_uncharge
from app.ledger.reservations import amounts_sum
from app.ledger.snapshot import LedgerRow, ledgers_read
from app.pass_config import ReconcilerConfig
from app.reconciler.walk import Decision, decisions_walk
from app.scheduling.inputs import PassInputs
from app.scheduling.parking import key_placed
from app.scheduling.planner import PassPlan
from app.scheduling.plugins.quota import CohortRow, QuotaRow
from app.scheduling.records import Displaced, Kind, Unclaim, Vector
from app.scheduling.snapshot import Snapshot

__all__ = ["CONFLICT_REASON", "PREEMPTION_CONFLICT", "Committed", "pass_commit"]

#: Event reason of a task handed back unparked after losing reservation races.
CONFLICT_REASON = "reservation_conflict"
#: Event reason of a task whose displacement's victims changed before it committed.
PREEMPTION_CONFLICT = "preemption_conflict"


@dataclass(slots=True)
class Committed:
    """What the commit wrote, for the pass's result."""

    leased: list[Decision] = field(default_factory=list)
    released: list[Decision] = field(default_factory=list)
    pending: int = 0
    unchanged: int = 0
    woken: int = 0
    rounds: int = 0
    walked: int = 0
    refused_pools: int = 0
    #: Displacements lost to a race, placements their quota refused at commit.
    displacement_conflicts: int = 0
    quota_conflicts: int = 0
    #: Displacements applied, by kind (their victims are revoking now).
    displaced: dict[Kind, list[Displaced]] = field(default_factory=dict)
    lost: dict[Kind, int] = field(default_factory=dict)
    nominations: Counter[str] = field(default_factory=Counter)


class _Applying:
    """The plan as the commit applies it: hand-backs and displacements change when a
    nomination or a displacement is dropped."""

    def __init__(self, plan: PassPlan) -> None:
        self.plan = plan
        self.unclaims = list(plan.unclaims)
        self.grants = {g.task_id: g for g in plan.displaced}
        self.released: set[uuid.UUID] = set()
        self.ended = dict(plan.nominations_ended)
        self.created: set[uuid.UUID] = set()

    def drop(self, lost: set[uuid.UUID] | frozenset[uuid.UUID], instead: dict) -> None:
        """Drop the displacements of ``lost``; their tasks get the hand-backs ``instead``."""
        for i, u in enumerate(self.unclaims):
            if u.task_id in lost:
                self.unclaims[i] = instead[u.task_id]
                self.grants.pop(u.task_id, None)


async def _nominations_apply(conn: Connection, state: _Applying, *, now: datetime,
                             out: Committed) -> None:
    """Release the passed nominees, record the new nominations, delete the ended ones."""
    plan = state.plan
    if plan.nominees_passed:
        # Nominees no other pass holds: unparked, their holds given back by the plan.
        locked = set(await nominees_release(conn, task_ids=plan.nominees_passed, now=now))
        for t in plan.nominees_passed:
            if t not in locked:
                del state.ended[t]
        state.released.update(locked)
    refused: dict[uuid.UUID, Unclaim] = {}
    for new in plan.nominations_created:
        if await nominations_insert(conn, task_id=new.task_id, runtime_class=new.runtime_class,
                                    members=new.members, now=now):
            state.created.add(new.task_id)
        else:
            refused[new.task_id] = new.fallback
    if refused:
        state.drop(set(refused), refused)
    if state.ended:
        gone = await nominations_delete(conn, task_ids=list(state.ended))
        await task_events_add(conn, rows=[
            {"task_id": t, "from_state": "ADMITTED", "to_state": "ADMITTED",
             "reason": NOMINATION_ENDED, "detail": {"outcome": o}}
            for t, o in sorted(state.ended.items()) if t in gone
        ], now=now)
        out.nominations.update(o for t, o in state.ended.items() if t in gone)


def _grants(decisions: list[Decision], instance: dict[str, str]) -> list[Grant]:
    """Return the grants of ``decisions`` (their members on the pools' runtime instances),
    each with its placement's stored text.

    A pass grants one per placement: the grant tuple is made at once (a named tuple's
    ``__new__`` is a Python call).
    """
    grants: list[Grant] = []
    add, new = grants.append, tuple.__new__
    for d in decisions:
        spec = d.spec
        members = d.members
        if len(members) == 1:
            ((p, c),) = members
            on: tuple[tuple[str, int, str], ...] = ((p, c, instance[p]),)
        else:
            on = tuple([(p, c, instance[p]) for p, c in members])
        wakes = (key_placed(spec.tenant_id),) if spec.labels else ()
        add(new(Grant, (d.task.id, d.placement_text(), on, spec.requests, wakes)))
    return grants


def _quota_plan(
    decisions: list[Decision], rows: tuple[QuotaRow, ...], tree: tuple[CohortRow, ...]
) -> QuotaPlan:
    """Return the quota charges of ``decisions``: those in managed runtime classes (some
    tenant's or cohort's quota names a resource)."""
    managed: dict[str, set[str]] = {}
    for rc, resource in [*((r.runtime_class, r.resource) for r in rows),
                         *((c.runtime_class, c.resource) for c in tree)]:
        managed.setdefault(rc, set()).add(resource)
    return QuotaPlan(
        of={d.task.id: (d.spec.tenant_id, d.spec.runtime_class) for d in decisions
            if d.spec.runtime_class in managed},
        managed={rc: frozenset(res) for rc, res in managed.items()},
        rows=frozenset((r.tenant_id, r.runtime_class, r.resource) for r in rows),
    )


async def _apply_rounds(
    conn: Connection, state: _Applying, decisions: list[Decision], *, instance: dict[str, str],
    quota: QuotaPlan | None, now: datetime, ttl: float, out: Committed,
) -> ApplyResult:
    """Apply the plan; drop the displacements that lost and apply again without them."""
    with cpu_phase("commit_build"):
        grants = tuple(_grants(decisions, instance))
    placed = [d.task.id for d in decisions]
    while True:
        out.rounds += 1
        plan = Plan(
            grants=grants, unclaims=tuple(state.unclaims),
            preemptions=tuple(state.grants.values()),
            holds_taken=state.plan.holds.given_back(placed, state.unclaims, state.released),
            quota=quota,
        )
        applied = await plan_apply(conn, plan=plan, now=now, lease_ttl_seconds=ttl)
        if not applied.lost_preemptions:
            return applied
        # A victim ended or was taken meanwhile, or a hold was refused: those tasks go back
        # to the queue (the savepoint undid the whole plan: apply it again without).
        lost = applied.lost_preemptions
        out.displacement_conflicts += len(lost)
        for t in lost:
            kind = state.grants[t].kind
            out.lost[kind] = out.lost.get(kind, 0) + 1
        state.drop(lost, {t: Unclaim(t, PREEMPTION_CONFLICT, None, parked=False)
                          for t in lost})


async def _refused_settle(
    conn: Connection, applied: ApplyResult, kept: list[Decision], *, snapshot: Snapshot,
    config: ReconcilerConfig, events: dict[uuid.UUID, int], now: datetime, out: Committed,
) -> tuple[list[Decision], list[Decision]]:
    """Walk the grants on the pools that refused them, in at most ``commit_rounds_max``
    reserving rounds; return the decisions leased and those released in the end."""
    instance = snapshot.instance_of
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
        out.refused_pools += len(refused)
        hit = [d for d in last if any(p in refused for p, _ in d.members)]
        undone = {id(d) for d in hit}
        kept = [d for d in kept if id(d) not in undone]
        # The members of a refused grant on pools that accepted (a gang's) were reserved.
        release = amounts_sum((p, *a) for m in (
            release_first, _members_amounts(hit, skip=refused)
        ) for p, a in m.items())
        release_first = {}
        walked: list[Decision] = []
        if out.rounds < config.commit_rounds_max:
            out.rounds += 1
            pools = set(refused) | {c.pool_id for d in hit for c in d.result.candidates}
            fresh = await ledgers_read(conn, pool_ids=pools)
            for pool_id in blocked & fresh.keys():
                fresh[pool_id] = LedgerRow(fresh[pool_id].total, fresh[pool_id].total)
            walks_before = sum(d.walks for d in hit)
            walked, dropped = decisions_walk(
                hit, fresh=fresh, snapshot=snapshot, walk_limit=config.reservation_walk_limit
            )
            out.walked += sum(d.walks for d in hit) - walks_before
        else:
            dropped = hit
        released += dropped
        leased, refused = await grants_settle(
            conn, undo=[d.task for d in hit], events=events, release=release,
            grants=_grants(walked, instance), now=now,
            lease_ttl_seconds=config.lease_ttl_seconds,
        )
        blocked |= refused
        events.update(leased)
        last = [d for d in walked if d.task.id in leased]
        released += [d for d in walked if d.task.id not in leased]
        kept += last
    return kept, released


def _members_amounts(
    decisions: list[Decision], *, skip: frozenset[str]
) -> dict[str, Vector]:
    """Return what the members of ``decisions`` on pools other than ``skip`` reserve."""
    return amounts_sum(
        (p, c * d.spec.requests[0], c * d.spec.requests[1], c * d.spec.requests[2])
        for d in decisions for p, c in d.members if p not in skip
    )


async def pass_commit(
    conn: Connection, *, plan: PassPlan, inputs: PassInputs, config: ReconcilerConfig,
    now: datetime,
) -> Committed:
    """Apply ``plan`` in the pass's transaction at commit time ``now``; return what was
    written (see the module doc)."""
    out = Committed()
    state = _Applying(plan)
    await _nominations_apply(conn, state, now=inputs.now, out=out)
    with cpu_phase("commit_build"):
        decisions = [Decision(p.task, p.spec, p.result, p.members) for p in plan.placed]
        quota = (_quota_plan(decisions, inputs.quota_rows, inputs.quota_cohorts)
                 if inputs.quota_rows or inputs.quota_cohorts else None)
    snapshot = inputs.snapshot
    applied = await _apply_rounds(conn, state, decisions, instance=snapshot.instance_of,
                                  quota=quota, now=now, ttl=config.lease_ttl_seconds, out=out)
    events = dict(applied.leased)
    # Placements their tenant's quota refused at commit (another pass charged first) hold
    # nothing: their leases are undone and they go back to the queue with the lost races.
    refused_quota = [d for d in decisions if d.task.id in applied.quota_refused]
    if refused_quota:
        await tasks_unlease(conn, tasks=[d.task for d in refused_quota], events=events, now=now)
        for d in refused_quota:
            del events[d.task.id]
        out.quota_conflicts = len(refused_quota)
    kept = [d for d in decisions if d.task.id in events]
    kept, released = await _refused_settle(conn, applied, kept, snapshot=snapshot,
                                           config=config, events=events, now=now, out=out)
    if quota is not None and released:
        # Charged at the first apply, placed nowhere in the end: their quota goes back.
        await quota_uncharge(conn, amounts=quota.amounts(grants_quota(
            _grants(released, snapshot.instance_of))))
    released += refused_quota
    # The placements refused in every round go back to the queue, unparked.
    await tasks_unclaim(conn, items=[
        Unclaim(d.task.id, CONFLICT_REASON, None, parked=False) for d in released
    ], now=now)
    out.leased, out.released = kept, released
    unclaimed = applied.unclaimed
    out.pending = sum(1 for u in state.unclaims if u.task_id in unclaimed)
    out.unchanged = sum(1 for u in state.unclaims if u.task_id in unclaimed and not u.event)
    out.woken = applied.woken
    for t in applied.preempted:
        g = state.grants[t]
        out.displaced.setdefault(g.kind, []).append(g)
    nominated = sum(1 for g in out.displaced.get(Kind.NOMINATE, ())
                    if g.task_id in state.created)
    if nominated:
        out.nominations["nominated"] += nominated
    return out
