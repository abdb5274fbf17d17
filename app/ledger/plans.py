"""Apply a pass's plan inside the pass's transaction: leases, hand-backs, then the ledger.

A reconciler pass decides purely and produces a :class:`Plan`; :func:`plan_apply` is the step
that writes it (as Nomad's plan applier does), inside the pass's one transaction, whose row
locks on the claimed tasks are the claim (:mod:`app.ledger.claims`). In the lock order every
writer follows (task rows, then lease rows, then ledger rows in pool-id order, last):

1. the holds of the plan's preemptors that are placed or parked again are deleted
   (:func:`~app.ledger.preemption.holds_take`), and each preemption turns its victims'
   leases ``REVOKING`` where they are all still ``ACTIVE`` and inserts its holds
   (:func:`~app.ledger.preemption.preemptions_apply`);
2. the granted tasks become ``LEASED``, with their reservations, one lease per pool and one
   event (:func:`~app.ledger.claims.tasks_lease`); the handed-back tasks are parked or left
   queued (:func:`~app.ledger.claims.tasks_unclaim`); the parked tasks that the leased tasks
   could help (``placed:<tenant>`` wake keys) are unparked
   (:func:`~app.ledger.claims.tasks_wake`, which skips locked rows and so never waits);
3. in a runtime class where some tenant has a quota, the leased grants are charged to their
   tenants' quota usage (:func:`~app.ledger.quotas.quota_charge`); a refused (tenant,
   class) adds nothing, and its grants are excluded from the ledger and undone by the
   caller (``quota_refused``);
4. last, one statement adds each pool's amount only where ``reserved + amount <= total``
   (:func:`~app.ledger.reservations.ledger_reserve_many`), locking every row of the plan in
   pool-id order. The amount nets the grants and the new holds against the holds given back.

A pool that refuses its amount (another reconciler got there first) does not undo the plan:
the result names the refused pools and the caller settles only the grants on them
(:func:`grants_settle`): their leases are undone, the pass walks them to other candidates
(:mod:`app.reconciler.walk`) and leases them again with a ledger statement that never waits.
Only a lost preemption (a victim no longer active, or a hold refused) rolls back: the plan
of a pass with preemptions is applied in a savepoint, and the caller drops those preemptors
and applies again.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from app.cpu_phases import cpu_phase
from app.db import Connection
from app.ledger.claims import (
    ClaimedTask,
    Grant,
    Unclaim,
    tasks_lease,
    tasks_unclaim,
    tasks_unlease,
    tasks_wake,
)
from app.ledger.preemption import holds_take, preemptions_apply
from app.ledger.quotas import QuotaPlan, quota_charge
from app.ledger.reservations import (
    Vector,
    amounts_sum,
    ledger_release_many,
    ledger_reserve_many,
)
from app.scheduling.records import Displaced

__all__ = [
    "ApplyResult",
    "Grant",
    "Plan",
    "Unclaim",
    "grants_amounts",
    "grants_quota",
    "grants_settle",
    "plan_apply",
]


def grants_amounts(grants: Sequence[Grant]) -> dict[str, Vector]:
    """Return what ``grants`` add to each pool's ledger (:func:`amounts_sum` of their
    members' amounts, summed here without a row per member: a pass has one per placement)."""
    out: dict[str, list[int]] = {}
    get = out.get
    for g in grants:
        cpu, memory, llm = g.requests
        for p, c, _ in g.members:
            acc = get(p)
            if acc is None:
                out[p] = [c * cpu, c * memory, c * llm]
            else:
                acc[0] += c * cpu
                acc[1] += c * memory
                acc[2] += c * llm
    return {p: (a[0], a[1], a[2]) for p, a in out.items()}


@dataclass(frozen=True, slots=True)
class Plan:
    """What a pass decided: placements to grant, and claimed tasks to hand back."""

    grants: tuple[Grant, ...] = ()
    unclaims: tuple[Unclaim, ...] = ()
    #: Preemptors handed back (in ``unclaims``) whose victims are revoked now.
    preemptions: tuple[Displaced, ...] = ()
    #: Tasks of the plan whose holds are given back first (placed, or handed back parked).
    holds_taken: tuple[uuid.UUID, ...] = ()
    #: The quota charges of the grants in managed runtime classes (None: none is managed).
    quota: QuotaPlan | None = None

    def amounts(self) -> dict[str, Vector]:
        """Return what the grants add to each pool's ledger."""
        return grants_amounts(self.grants)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What :func:`plan_apply` wrote.

    With ``lost_preemptions`` nothing was written (the savepoint rolled back). Otherwise
    every grant is leased (``leased``: its ``leased`` event id) and every hand-back applied,
    but the grants on ``refused`` pools hold no capacity yet: the caller settles them
    (:func:`grants_settle`) before the transaction commits.
    """

    leased: Mapping[uuid.UUID, int] = field(default_factory=dict)
    unclaimed: frozenset[uuid.UUID] = frozenset()
    refused: frozenset[str] = frozenset()
    #: Holds given back on the refused pools: their amounts are still in the ledger.
    taken_refused: Mapping[str, Vector] = field(default_factory=dict)
    #: Parked tasks unparked because a leased task could help them.
    woken: int = 0
    #: Preemptors whose victims were not all still active, or whose holds were refused.
    lost_preemptions: frozenset[uuid.UUID] = frozenset()
    #: Preemptors whose victims are now revoking.
    preempted: frozenset[uuid.UUID] = frozenset()
    #: Grants leased but refused by their tenant's quota (a race another pass won): they
    #: hold no capacity and no quota; the caller undoes their leases.
    quota_refused: frozenset[uuid.UUID] = frozenset()


class _Lost(Exception):
    """Roll back the plan's savepoint: these preemptions lost."""

    def __init__(self, preemptors: frozenset[uuid.UUID]) -> None:
        super().__init__(f"{len(preemptors)} preemption(s) lost")
        self.preemptors = preemptors


def _net(*signed: tuple[int, Mapping[str, Vector]]) -> dict[str, Vector]:
    """Return the per-pool sum of ``sign * amounts`` over ``signed``."""
    return amounts_sum(
        (p, sign * a[0], sign * a[1], sign * a[2]) for sign, amounts in signed
        for p, a in amounts.items()
    )


async def _apply(
    conn: Connection, *, plan: Plan, now: datetime, lease_ttl_seconds: float
) -> ApplyResult:
    # Holds are given back under their tasks' locks, before those tasks' rows change.
    taken = await holds_take(conn, task_ids=plan.holds_taken)
    lost = await preemptions_apply(conn, preemptions=plan.preemptions, now=now)
    if lost:
        raise _Lost(frozenset(lost))
    leased = await tasks_lease(
        conn, grants=plan.grants, now=now, lease_ttl_seconds=lease_ttl_seconds
    )
    refused_quota: frozenset[uuid.UUID] = frozenset()
    if plan.quota is not None:
        refused_quota = await _quota_charge(conn, plan.quota, plan.grants, leased)
    unclaimed = await tasks_unclaim(conn, items=plan.unclaims, now=now)
    keys = {k for g in plan.grants if g.task_id in leased and g.task_id not in refused_quota
            for k in g.wakes}
    woken = await tasks_wake(conn, keys=keys, now=now) if keys else 0
    with cpu_phase("commit_build"):
        held = amounts_sum(
            (p, *a) for pre in plan.preemptions for p, a in pre.amounts().items())
        granted = grants_amounts(
            [g for g in plan.grants if g.task_id in leased and g.task_id not in refused_quota]
        )
        amounts = _net((1, granted), (1, held), (-1, taken))
    refused = frozenset(amounts) - await ledger_reserve_many(conn, amounts=amounts, now=now)
    holding = {
        pre.task_id for pre in plan.preemptions
        if any(any(a) and p in refused for p, _, a in pre.holds)
    }
    if holding:
        raise _Lost(frozenset(holding))
    return ApplyResult(
        leased, frozenset(unclaimed), refused,
        taken_refused={p: a for p, a in taken.items() if p in refused},
        woken=woken, preempted=frozenset(p.task_id for p in plan.preemptions),
        quota_refused=refused_quota,
    )


def grants_quota(grants: Sequence[Grant]) -> list[tuple[uuid.UUID, tuple[int, int, int], int]]:
    """Return (task id, requests, members) of ``grants``, as :class:`QuotaPlan` reads them."""
    return [(g.task_id, g.requests, sum(c for _, c, _ in g.members)) for g in grants]


async def _quota_charge(
    conn: Connection, quota: QuotaPlan, grants: Sequence[Grant], leased: Mapping[uuid.UUID, int]
) -> frozenset[uuid.UUID]:
    """Charge the leased grants to their tenants' quotas; return the grants refused."""
    charged = [g for g in grants if g.task_id in leased]
    refused = await quota_charge(
        conn, amounts=quota.amounts(grants_quota(charged)), exists=quota.rows
    )
    if not refused:
        return frozenset()
    return frozenset(g.task_id for g in charged if quota.of.get(g.task_id) in refused)


async def plan_apply(
    conn: Connection, *, plan: Plan, now: datetime, lease_ttl_seconds: float
) -> ApplyResult:
    """Apply ``plan`` in the caller's transaction (which holds the plan's tasks locked);
    return what was applied, the pools that refused, or the preemptions that lost."""
    if not plan.preemptions:
        return await _apply(conn, plan=plan, now=now, lease_ttl_seconds=lease_ttl_seconds)
    try:
        async with conn.transaction():
            return await _apply(
                conn, plan=plan, now=now, lease_ttl_seconds=lease_ttl_seconds
            )
    except _Lost as lost:
        return ApplyResult(lost_preemptions=lost.preemptors)


async def grants_settle(
    conn: Connection,
    *,
    undo: Sequence[ClaimedTask],
    events: Mapping[uuid.UUID, int],
    release: Mapping[str, Vector],
    grants: Sequence[Grant],
    now: datetime,
    lease_ttl_seconds: float,
) -> tuple[dict[uuid.UUID, int], frozenset[str]]:
    """Undo the leases of ``undo`` (whose pools refused), give ``release`` back to pools this
    transaction holds, then lease ``grants`` (where they walked) and reserve their amounts
    without waiting; return the new ``leased`` event ids and the pools that refused again.
    """
    await tasks_unlease(conn, tasks=undo, events=events, now=now)
    await ledger_release_many(conn, amounts=release, now=now)
    leased = await tasks_lease(
        conn, grants=grants, now=now, lease_ttl_seconds=lease_ttl_seconds
    )
    amounts = grants_amounts([g for g in grants if g.task_id in leased])
    refused = frozenset(amounts) - await ledger_reserve_many(
        conn, amounts=amounts, now=now, wait=False
    )
    return leased, refused
