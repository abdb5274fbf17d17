"""Apply a pass's plan: leases, hand-backs and the ledger in one transaction, ledger last.

A reconciler pass decides purely and produces a :class:`Plan`; :func:`plan_apply` is the one
step that writes it (as Nomad's plan applier does). In one transaction, in the lock order
every writer follows (task rows, then lease rows, then ledger rows in pool-id order):

1. the granted tasks still ``CLAIMED`` by the pass become ``LEASED``, with their
   reservations, one lease per pool and their events (:func:`~app.ledger.claims.tasks_lease`);
2. the handed-back tasks go back to ``ADMITTED`` (:func:`~app.ledger.claims.tasks_unclaim`);
   then the parked tasks that the leased tasks could help (``placed:<tenant>`` wake keys of
   labelled placements: required affinity that had nothing to follow) are unparked
   (:func:`~app.ledger.claims.tasks_wake`, which skips locked rows and so never waits);
3. preemptions: the victims' leases go ``REVOKING`` only where they are all still
   ``ACTIVE``, and each preemptor (handed back in step 2) gets its hold rows
   (:func:`~app.ledger.preemption.preemptions_apply`);
4. last, each pool's amount is added only where ``reserved + amount <= total``
   (:func:`~app.ledger.reservations.ledger_reserve_many`). The amount nets the grants and the
   new holds against the holds the plan's preemptors give back (taken first, under their
   task locks, by :func:`~app.ledger.preemption.holds_take`).

When a pool refuses, or a victim is no longer active (another writer got there first), the
whole transaction rolls back and the result names the pools or preemptors that lost the
race: nothing of the plan is written, so the ledger's reserved amounts still equal the sum of
the live reservations. The caller re-reads those pools, walks or hands back the affected
tasks, and applies a new plan.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from app.db import Connection
from app.ledger.claims import Grant, Unclaim, tasks_lease, tasks_unclaim, tasks_wake
from app.ledger.preemption import PreemptionGrant, holds_take, preemptions_apply
from app.ledger.reservations import Vector, amounts_sum, ledger_reserve_many

__all__ = ["ApplyResult", "Grant", "Plan", "PreemptionGrant", "Unclaim", "plan_apply"]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a pass decided: placements to grant, and claimed tasks to hand back."""

    grants: tuple[Grant, ...] = ()
    unclaims: tuple[Unclaim, ...] = ()
    #: Preemptors handed back (in ``unclaims``) whose victims are revoked now.
    preemptions: tuple[PreemptionGrant, ...] = ()
    #: Tasks of the plan whose holds are given back first (placed, or handed back parked).
    holds_taken: tuple[uuid.UUID, ...] = ()

    def amounts(self) -> dict[str, tuple[int, int, int]]:
        """Return what the grants add to each pool's ledger."""
        return amounts_sum(
            (p, c * g.requests[0], c * g.requests[1], c * g.requests[2])
            for g in self.grants
            for p, c, _ in g.members
        )


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What :func:`plan_apply` wrote: the tasks leased and handed back, or the pools that lost.

    When ``lost`` is not empty nothing was written (``leased`` and ``unclaimed`` are empty).
    A planned task missing from ``leased``/``unclaimed`` of an applied plan was no longer
    claimed by the pass (cancelled, or its claim expired and was taken again).
    """

    leased: frozenset[uuid.UUID] = frozenset()
    unclaimed: frozenset[uuid.UUID] = frozenset()
    lost: frozenset[str] = frozenset()
    #: Parked tasks unparked because a leased task could help them.
    woken: int = 0
    #: Preemptors whose victims were not all still active (nothing was written).
    lost_preemptions: frozenset[uuid.UUID] = frozenset()
    #: Preemptors whose victims are now revoking.
    preempted: frozenset[uuid.UUID] = frozenset()

    @property
    def applied(self) -> bool:
        """Return whether the plan was committed."""
        return not self.lost and not self.lost_preemptions


class _Lost(Exception):
    """Roll back the plan's transaction: these pools refused, or these preemptions lost."""

    def __init__(
        self, pools: frozenset[str], preemptors: frozenset[uuid.UUID] = frozenset()
    ) -> None:
        super().__init__(f"{len(pools)} pool(s) refused, {len(preemptors)} preemption(s) lost")
        self.pools = pools
        self.preemptors = preemptors


def _net(*signed: tuple[int, dict[str, Vector]]) -> dict[str, Vector]:
    """Return the per-pool sum of ``sign * amounts`` over ``signed``."""
    return amounts_sum(
        (p, sign * a[0], sign * a[1], sign * a[2]) for sign, amounts in signed
        for p, a in amounts.items()
    )


async def plan_apply(
    conn: Connection,
    *,
    plan: Plan,
    owner: str,
    now: datetime,
    lease_ttl_seconds: float,
    claimed_at: datetime | None = None,
) -> ApplyResult:
    """Apply ``plan`` for the claim ``owner`` in one transaction; return what was applied.

    Pass an autocommit connection (``db.connection()``): the transaction commits before this
    returns, and a failure at COMMIT raises. Inside a caller's transaction it runs in a
    savepoint. A lost race rolls everything back and is returned, never raised.
    ``claimed_at`` is the time of the pass's claim (deferred ``claimed`` events carry it).
    """
    try:
        async with conn.transaction():
            # Holds are given back under their tasks' locks, before those tasks' rows change.
            taken = await holds_take(conn, owner=owner, task_ids=plan.holds_taken)
            leased = await tasks_lease(
                conn, owner=owner, grants=plan.grants, now=now,
                lease_ttl_seconds=lease_ttl_seconds, claimed_at=claimed_at,
            )
            unclaimed = await tasks_unclaim(
                conn, owner=owner, items=plan.unclaims, now=now, claimed_at=claimed_at
            )
            preemptions = tuple(p for p in plan.preemptions if p.task_id in unclaimed)
            lost = await preemptions_apply(conn, preemptions=preemptions, now=now)
            if lost:
                raise _Lost(frozenset(), frozenset(lost))
            keys = {k for g in plan.grants if g.task_id in leased for k in g.wakes}
            woken = await tasks_wake(conn, keys=keys, now=now) if keys else 0
            # Only the tasks still claimed were leased: only their amounts are reserved.
            granted = Plan(tuple(g for g in plan.grants if g.task_id in leased)).amounts()
            held = amounts_sum(
                (p, *a) for pre in preemptions for p, a in pre.amounts().items()
            )
            amounts = _net((1, granted), (1, held), (-1, taken))
            refused = frozenset(amounts) - await ledger_reserve_many(
                conn, amounts=amounts, now=now
            )
            if refused:
                raise _Lost(refused)
    except _Lost as lost:
        return ApplyResult(lost=lost.pools, lost_preemptions=lost.preemptors)
    return ApplyResult(
        frozenset(leased), frozenset(unclaimed), woken=woken,
        preempted=frozenset(p.task_id for p in preemptions),
    )
