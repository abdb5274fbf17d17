"""Reclaim planning: which borrowed leases of a cohort a task within its nominal takes back.

A quota's ``nominal`` is guaranteed: a task whose tenant is, with the task, within its
nominal in every managed resource of the task's runtime class, and that finds no pool because
other tenants of its cohort borrowed the capacity, **reclaims** it. Planning is pure, like
``select`` and :mod:`app.scheduling.preemption`, whose result (:class:`Preemption`) and
victim records (:class:`Victim`) it reuses:

* **Borrowed work.** A tenant *borrows* a managed resource where its usage in the class (less
  what its leases being revoked already give back) is above its nominal; the excess is what
  reclaim may take from it. A lease is borrowed work when it holds some of a resource its
  tenant borrows. A set of leases of one tenant may be taken only while, in every resource
  that tenant borrows, its usage after the set stays at or above its nominal: a victim tenant
  is never pushed below its nominal (resources it does not borrow do not limit it, since
  taking from them takes nothing it is guaranteed beyond what it holds).
* **Who reclaims.** Only a task whose tenant is within its nominal with the task (usage plus
  the needs of its reclaims still waiting plus the task -- all members of a gang --, in every
  managed resource), from leases of *other* tenants of *its cohort*, leased at least the
  minimum runtime ago. Hence no reclaim loop: after a reclaim the reclaimer is within its
  nominal (borrows nothing, so nobody can take from it), and a victim tenant stays at or
  above its nominal in what it borrowed, so its requeued victims do not fit its nominal and
  cannot reclaim back.
* **Gang victims.** A gang's leases are one victim (:class:`Victim` lists every pool it
  holds), as in preemption: taken whole or not at all, only while its tenant's borrowed
  budget covers all its members (:func:`victim_total`), and it frees its members on every
  pool it holds.
* **Victims on a pool.** Among the pools that pass every filter except capacity
  (``feasible_but_capacity``), per pool: the victims that free something the task lacks
  there, lowest priority first, then the most recently leased, each taken only while its
  tenant's borrowed budget allows; then every victim not needed after all is spared (the
  highest priority, oldest first). The pool with the cheapest set wins
  (:func:`~app.scheduling.preemption.victims_key`: the lowest highest priority, then the
  fewest victims, ...), equal sets by score, then pool id.
* **Gang reclaimers.** A gang reclaims for all its members or not at all, with preemption's
  gang planner (:func:`~app.scheduling.preemption.plan_gang`): one plan over the room each
  pool would have with its eligible borrowed leases gone, then per pool of the plan the set
  above, the victim tenants' budgets shared by all the pools. If some pool of the plan then
  finds no set (a budget ran out), the gang does not reclaim in this pass.

:class:`ReclaimBook` holds the usage a pass read and follows the pass's displacements, so a
later reclaim of the pass never counts a victim tenant's borrowed work twice.

**Waiting displacements in the book.** A preemptor or reclaimer waiting for its victims
holds capacity for its need; until its victims stop, their usage is still their tenants'.
The quota rows a pass plans with (:func:`displacers_counted`) count, per tenant and class,
the needs of its waiting displacements less what its own leases being revoked give back
(never below what the ledger charges it now: a task placed meanwhile is charged with the
victims still running); the rest of what those leases give back is subtracted by the
reclaim book and by the judgement of a waiting displacer, which so see each tenant's usage
once every victim has stopped and every displacement is placed. Each need is counted once,
and each victim's usage given back once, whichever kind displaced it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from app.scheduling.assumed import Assumed
from app.scheduling.framework import feasible_but_capacity
from app.scheduling.plugins.quota import RESOURCES, QuotaBook, QuotaRow
from app.scheduling.plugins.registry import Profile
from app.scheduling.preemption import (
    Preemption,
    Victim,
    VictimIndex,
    plan_gang,
    plan_single,
)
from app.scheduling.records import Vector
from app.scheduling.shares import share_of
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

__all__ = ["FairTest", "ReclaimBook", "book_displaced", "displaced_need",
           "displacers_counted", "fair_test", "plan_reclaim", "reclaim_victims", "victim_total"]

Key = tuple[str, str]  # (tenant, runtime class)


def _zero() -> np.ndarray:
    return np.zeros(3, dtype=np.int64)


def victim_total(v: Victim) -> np.ndarray:
    """Return what a victim holds in all (every member, every pool)."""
    return np.array(v.requests, dtype=np.int64) * sum(c for _, c in v.members)


def displacers_counted(
    rows: list[QuotaRow], needs: Iterable[tuple[str, str, Vector]],
    revoking: Mapping[Key, Vector],
) -> tuple[list[QuotaRow], dict[Key, Vector]]:
    """Return the quota rows with the needs of the waiting displacements (``needs``: tenant,
    class and need of each waiting preemptor and reclaimer) counted, and what the leases
    being revoked (``revoking``, by tenant and class) still give back beyond that.

    Per tenant, class and resource, with N its waiting displacements' needs and R what its
    leases being revoked give back, the rows count ``max(0, N - R)`` more and
    ``max(0, R - N)`` is left to give back (see the module doc). ``rows`` itself is returned
    when nothing is waiting."""
    wanted: dict[Key, list[int]] = {}
    for tenant, rc, need in needs:
        acc = wanted.setdefault((tenant, rc), [0, 0, 0])
        for k in range(3):
            acc[k] += need[k]
    if not wanted:
        return rows, dict(revoking)
    left = dict(revoking)
    more: dict[Key, list[int]] = {}
    for key, want in wanted.items():
        given = revoking.get(key, (0, 0, 0))
        more[key] = [max(want[k] - given[k], 0) for k in range(3)]
        if key in left:
            left[key] = (max(given[0] - want[0], 0), max(given[1] - want[1], 0),
                         max(given[2] - want[2], 0))
    counted = []
    for r in rows:
        add = more.get((r.tenant_id, r.runtime_class))
        amount = add[RESOURCES.index(r.resource)] if add is not None else 0
        counted.append(dataclasses.replace(r, used=r.used + amount) if amount else r)
    return counted, left


def displaced_need(spec: CompiledSpec, victims: Iterable[Victim]) -> Vector:
    """Return what a displacement planned for ``spec`` adds to its tenant's usage in the quota
    book while it waits: its need less what its own tenant's ``victims`` give back, at least
    0 (see the module doc)."""
    out = np.array(spec.total_requests, dtype=np.int64)
    for v in victims:
        if v.tenant_id == spec.tenant_id:
            out -= victim_total(v)
    out = np.maximum(out, 0)
    return (int(out[0]), int(out[1]), int(out[2]))


class ReclaimBook:
    """Tenants' usage against their nominal in managed runtime classes (pure, mutable).

    ``rows`` are the quota rows of the classes; ``revoking`` what each (tenant, class) gives
    back already (leases being revoked); ``waiting`` what each (tenant, class) will take for
    its reclaims still waiting for their victims. Resources no quota of a class names are not
    managed there and never limit anything.
    """

    __slots__ = ("_cohort", "_managed", "_nominal", "_quota", "_used")

    def __init__(
        self,
        rows: Iterable[QuotaRow],
        cohorts: Mapping[str, str] = {},
        *,
        revoking: Mapping[Key, Vector] = {},
        waiting: Mapping[Key, Vector] = {},
        quota: QuotaBook | None = None,
    ) -> None:
        self._cohort: dict[str, str] = dict(cohorts)
        #: The pass's quota book: what each tenant's parent can lend, and the weights.
        self._quota = quota
        self._managed: dict[str, np.ndarray] = {}
        self._nominal: dict[Key, np.ndarray] = {}
        self._used: dict[Key, np.ndarray] = {}
        for r in rows:
            k = RESOURCES.index(r.resource)
            self._managed.setdefault(r.runtime_class, np.zeros(3, dtype=bool))[k] = True
            self._nominal.setdefault((r.tenant_id, r.runtime_class), _zero())[k] = r.nominal
            self._used.setdefault((r.tenant_id, r.runtime_class), _zero())[k] = r.used
            self._cohort.setdefault(r.tenant_id, r.cohort)
        for key, amount in revoking.items():
            self.add(*key, np.negative(np.array(amount, dtype=np.int64)))
        for key, amount in waiting.items():
            self.add(*key, np.array(amount, dtype=np.int64))

    def cohort(self, tenant_id: str) -> str:
        """Return the tenant's cohort."""
        return self._cohort.get(tenant_id, "default")

    def managed(self, runtime_class: str) -> np.ndarray | None:
        """Return which resources of ``runtime_class`` are managed (None: none is)."""
        return self._managed.get(runtime_class)

    def _get(self, table: dict[Key, np.ndarray], key: Key) -> np.ndarray:
        # A tenant without a quota in a managed class has nominal 0 there.
        return table.get(key, _zero())

    def add(self, tenant_id: str, runtime_class: str, amount: np.ndarray) -> None:
        """Add ``amount`` (negative: take it off) to the tenant's usage in the class."""
        if runtime_class not in self._managed:
            return
        key = (tenant_id, runtime_class)
        self._used[key] = self._get(self._used, key) + amount

    def within_nominal(self, tenant_id: str, runtime_class: str, need: Sequence[int]) -> bool:
        """Return whether the tenant, with ``need`` more, is within its nominal in every
        managed resource of the class (False when the class is not managed)."""
        mask = self._managed.get(runtime_class)
        if mask is None:
            return False
        key = (tenant_id, runtime_class)
        after = self._get(self._used, key) + np.array(need, dtype=np.int64)
        return bool((after[mask] <= self._get(self._nominal, key)[mask]).all())

    def borrowed(self, tenant_id: str, runtime_class: str) -> np.ndarray:
        """Return what the tenant borrows in the class, per resource (0 where unmanaged)."""
        mask = self._managed.get(runtime_class)
        if mask is None:
            return _zero()
        key = (tenant_id, runtime_class)
        over = np.maximum(self._get(self._used, key) - self._get(self._nominal, key), 0)
        return np.where(mask, over, 0)


    def share(
        self, tenant_id: str, runtime_class: str, more: np.ndarray | None = None
    ) -> float:
        """Return the tenant's share in the class (with ``more`` usage: negative to take
        some off), measured against what its parent in the quota book can lend
        (:func:`~app.scheduling.fairshare.share_of`; 0 without a quota book)."""
        mask = self._managed.get(runtime_class)
        if mask is None or self._quota is None:
            return 0.0
        key = (tenant_id, runtime_class)
        used = self._get(self._used, key)
        if more is not None:
            used = used + more
        borrowed = np.where(mask, np.maximum(used - self._get(self._nominal, key), 0), 0)
        _, lendable = self._quota.borrowing(tenant_id, runtime_class)
        return share_of(borrowed.tolist(), lendable, self._quota.tenant_weight(tenant_id))


@dataclass(frozen=True, slots=True)
class FairTest:
    """Which victims a fair-share reclaim may take: leases of tenants whose share is above
    the reclaimer's share with its task (``lender``), in sets after which each victim
    tenant's share is still at least that (``accepts``)."""

    lender: Callable[[str], bool]
    accepts: Callable[[Sequence[Victim]], bool]


def fair_test(book: ReclaimBook, spec: CompiledSpec) -> FairTest:
    """Return the fairness test of a fair-share reclaim for ``spec`` on ``book``: the
    reclaimer's share with its task must stay at or below each victim tenant's share after
    the set is taken (no reclaim back and forth)."""
    rc = spec.runtime_class
    mine = book.share(spec.tenant_id, rc, np.array(spec.total_requests, dtype=np.int64))

    def lender(tenant_id: str) -> bool:
        return book.share(tenant_id, rc) > mine

    def accepts(chosen: Sequence[Victim]) -> bool:
        taken: dict[str, np.ndarray] = {}
        for v in chosen:
            taken[v.tenant_id] = taken.get(v.tenant_id, _zero()) + victim_total(v)
        return all(book.share(t, rc, np.negative(a)) >= mine for t, a in taken.items())

    return FairTest(lender, accepts)


def reclaim_victims(
    free: np.ndarray,
    need: np.ndarray,
    eligible: Sequence[Victim],
    pool_id: str,
    borrowed: Mapping[str, np.ndarray],
    spent: Mapping[str, np.ndarray] = {},
) -> tuple[Victim, ...] | None:
    """Return the victims among ``eligible`` whose leases free ``need`` on top of ``free``
    on ``pool_id`` without taking more from any tenant than it borrows (``borrowed``, per
    tenant, less what other pools' sets took already: ``spent``); () when it fits already;
    None when no such set exists (greedy, see the module doc)."""
    deficit = np.maximum(need - free, 0)
    if not deficit.any():
        return ()
    wanted = deficit > 0
    left = {t: b - spent[t] if t in spent else b.copy() for t, b in borrowed.items()}
    order = sorted(eligible, key=lambda v: (v.priority, -v.leased_at, v.task_id))
    chosen: list[tuple[Victim, np.ndarray]] = []
    freed = _zero()
    for v in order:
        amount = v.amount_on(pool_id)
        if not (amount[wanted] > 0).any():
            continue
        budget = left.get(v.tenant_id)
        if budget is None:
            continue
        borrows = borrowed[v.tenant_id] > 0
        total = victim_total(v)
        if not (total[borrows] > 0).any() or (total[borrows] > budget[borrows]).any():
            continue  # frees nothing borrowed, or would push its tenant below nominal
        budget -= np.where(borrows, total, 0)
        chosen.append((v, amount))
        freed += amount
        if (freed >= deficit).all():
            break
    else:
        return None
    # Spare whoever is not needed after all: the last taken (highest priority, oldest) first.
    for v, amount in reversed(list(chosen)):
        if ((freed - amount) >= deficit).all():
            chosen.remove((v, amount))
            freed = freed - amount
    return tuple(v for v, _ in chosen)


def plan_reclaim(
    spec: CompiledSpec,
    snapshot: Snapshot,
    victims: VictimIndex,
    book: ReclaimBook,
    *,
    assumed: Assumed | None = None,
    taken: Collection[str] = frozenset(),
    holds: dict[str, Vector] | None = None,
    leased_before: float = float("inf"),
    profile: Profile | None = None,
    fair: FairTest | None = None,
) -> Preemption | None:
    """Plan the reclaim that would let ``spec`` fit, or None (see the module doc).

    ``taken`` are victims other plans of the pass claimed already; ``leased_before`` the
    latest lease time a victim may have (now less the minimum runtime). With ``fair``, a
    fair-share reclaim: the task need not be within its nominal, and its victims are those
    the test allows.
    """
    rc, tenant = spec.runtime_class, spec.tenant_id
    if fair is None and not book.within_nominal(tenant, rc, spec.total_requests):
        return None
    idx, total, cycle = feasible_but_capacity(spec, snapshot, assumed=assumed, holds=holds,
                                              profile=profile)
    if len(idx) == 0:
        return None
    cohort = book.cohort(tenant)
    borrowed: dict[str, np.ndarray] = {}

    def lender(t: str) -> bool:
        if t not in borrowed:
            ok = (t != tenant and book.cohort(t) == cohort
                  and (fair is None or fair.lender(t)))
            borrowed[t] = book.borrowed(t, rc) if ok else _zero()
        return bool(borrowed[t].any())

    def eligible_on(i: int) -> list[Victim]:
        return [
            v for v in victims.on(i)
            if v.task_id not in taken and v.leased_at <= leased_before and lender(v.tenant_id)
        ]

    req, free_all = cycle.req, cycle.available(idx)
    if spec.is_gang:
        spent: dict[str, np.ndarray] = {}

        def cheapest(
            free: np.ndarray, need: np.ndarray, eligible: Sequence[Victim], pool_id: str
        ) -> tuple[Victim, ...] | None:
            chosen = _fair(reclaim_victims(free, need, eligible, pool_id, borrowed, spent),
                           fair)
            for v in chosen or ():
                took = np.where(borrowed[v.tenant_id] > 0, victim_total(v), 0)
                spent[v.tenant_id] = spent.get(v.tenant_id, _zero()) + took
            return chosen

        return plan_gang(spec, snapshot, idx, total, free_all, req, eligible_on,
                         cheapest=cheapest)

    def cheapest_single(
        free: np.ndarray, need: np.ndarray, eligible: Sequence[Victim], pool_id: str
    ) -> tuple[Victim, ...] | None:
        return _fair(reclaim_victims(free, need, eligible, pool_id, borrowed), fair)

    return plan_single(snapshot, idx, total, free_all, req, eligible_on,
                       cheapest=cheapest_single)


def _fair(
    chosen: tuple[Victim, ...] | None, fair: FairTest | None
) -> tuple[Victim, ...] | None:
    """Return ``chosen`` unless the fairness test refuses it."""
    if chosen is None or fair is None or fair.accepts(chosen):
        return chosen
    return None


def book_displaced(book: ReclaimBook, spec: CompiledSpec, victims: Iterable[Victim]) -> None:
    """Count a planned displacement (a preemption or a reclaim) in ``book``: its victims'
    tenants give back, its tenant takes."""
    rc = spec.runtime_class
    for v in victims:
        book.add(v.tenant_id, rc, np.negative(victim_total(v)))
    book.add(spec.tenant_id, rc, np.array(spec.total_requests, dtype=np.int64))
