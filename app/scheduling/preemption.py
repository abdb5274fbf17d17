"""Preemption planning: which lower-priority tasks of the same tenant a task would displace.

A task whose spec says ``preemption: "lowerPriority"`` and that fits nowhere may displace
**leased tasks of its own tenant with strictly lower priority** (never another tenant's:
tenants are isolated customers, and taking back one tenant's capacity for another is quota
policy: reclaim, :mod:`app.scheduling.reclaim`). Planning is pure, like ``select``:

1. The pools that pass every filter except capacity (``feasible_but_capacity``), ranked as
   ``select`` ranks them.
2. Per pool, the cheapest victim set that frees what the task lacks there
   (:func:`victims_cheapest`): victims are taken by priority (lowest first), larger ones
   first within a priority, most recently leased first within a size; then every victim
   that is not needed after all is spared, highest priority (and oldest) first. A pool where
   evicting every eligible victim still would not make room is no candidate.
3. The sets compare by :func:`victims_key`: the lowest highest priority, then the fewest
   victims, then the lower priorities overall, then the most recently leased (the least work
   lost). The pool with the cheapest set wins; equal sets go to the higher score, then the
   smaller pool id.
4. A gang preempts for all its members or not at all: the gang planner (even spreads, then
   the uneven plan) runs over the room each pool would have with every eligible victim gone;
   each pool of the chosen plan then gets its cheapest set. A victim that is itself a gang
   frees its members on every pool it holds.

The result names the victims, the members' pools, and what the preemptor holds at once from
the free part of each pool (the victims' share is handed over as each of them ends).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from app.scheduling.assumed import Assumed
from app.scheduling.framework import feasible_but_capacity
from app.scheduling.gangs import place_gang
from app.scheduling.plugins.registry import Profile
from app.scheduling.records import Vector
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

__all__ = [
    "PoolVictims",
    "Preemption",
    "Victim",
    "VictimIndex",
    "plan_gang",
    "plan_single",
    "plan_preemption",
    "victims_cheapest",
    "victims_key",
]



@dataclass(frozen=True, slots=True)
class Victim:
    """A leased task that a preemptor of its tenant may displace."""

    task_id: str
    tenant_id: str
    priority: int
    #: When it was leased (seconds since the epoch): the more recent, the less work lost.
    leased_at: float
    #: What one member requests.
    requests: Vector
    #: (pool id, members) per pool it holds.
    members: tuple[tuple[str, int], ...]

    def amount_on(self, pool_id: str) -> np.ndarray:
        """Return what the victim holds on ``pool_id``."""
        count = sum(c for p, c in self.members if p == pool_id)
        return np.array(self.requests, dtype=np.int64) * count


class VictimIndex:
    """The leased tasks displacements may take, by the position of their pools in a
    snapshot (immutable): preemption asks for a tenant's, reclaim for every tenant's."""

    __slots__ = ("_by_pool",)

    def __init__(self, snapshot: Snapshot, victims: Iterable[Victim]) -> None:
        by_pool: dict[int, list[Victim]] = {}
        pos = snapshot.pos
        for v in victims:
            for pool_id, _ in v.members:
                i = pos.get(pool_id)
                if i is not None:
                    by_pool.setdefault(i, []).append(v)
        self._by_pool = {k: tuple(vs) for k, vs in by_pool.items()}

    def on(self, pool: int, tenant_id: str | None = None) -> tuple[Victim, ...]:
        """Return the tasks holding capacity on the pool at ``pool`` (of ``tenant_id``
        only, when given)."""
        found = self._by_pool.get(pool, ())
        if tenant_id is None or not found:
            return found
        return tuple(v for v in found if v.tenant_id == tenant_id)


@dataclass(frozen=True, slots=True)
class PoolVictims:
    """A pool where evicting ``victims`` would make room, with the set's cost key."""

    pool_id: str
    score: float
    victims: tuple[Victim, ...]
    key: tuple


@dataclass(frozen=True, slots=True)
class Preemption:
    """A planned preemption: the members' pools, the victims, and what is held at once."""

    members: tuple[tuple[str, int], ...]
    victims: tuple[Victim, ...]
    #: (pool id, members, amount) per pool of ``members``: the free capacity the preemptor
    #: holds at once (what its victims there will not free).
    holds: tuple[tuple[str, int, Vector], ...]
    #: Every candidate pool with its cheapest victim set, cheapest first (the preview's list).
    candidates: tuple[PoolVictims, ...] = ()

    @property
    def pool_id(self) -> str:
        """Return the first member's pool."""
        return self.members[0][0]


def victims_key(victims: Sequence[Victim]) -> tuple:
    """Return the cost of a victim set: lower is cheaper.

    The highest victim priority first, then the number of victims, then every priority
    (highest first), then the most recently leased (the oldest victim as recent as possible).
    """
    if not victims:
        return (-(10**9), 0, (), 0.0)
    prios = sorted((v.priority for v in victims), reverse=True)
    return (prios[0], len(victims), tuple(prios), -min(v.leased_at for v in victims))


def _cheapest_key(amounts: Mapping[str, np.ndarray], wanted: np.ndarray,
                  deficit: np.ndarray, v: Victim) -> tuple:
    """Return the eviction order key of ``v``: priority, then the most of the deficit it
    covers, the latest leased, the task id."""
    a = amounts[v.task_id]
    coverage = float((np.minimum(a[wanted], deficit[wanted]) / deficit[wanted]).sum())
    return (v.priority, -coverage, -v.leased_at, v.task_id)


def victims_cheapest(
    free: np.ndarray, need: np.ndarray, eligible: Sequence[Victim], pool_id: str
) -> tuple[Victim, ...] | None:
    """Return the cheapest set of ``eligible`` whose eviction frees ``need`` on top of
    ``free`` on ``pool_id``, in eviction order; () when it fits already; None when even
    evicting every eligible victim would not make room."""
    deficit = np.maximum(need - free, 0)
    if not deficit.any():
        return ()
    amounts = {v.task_id: v.amount_on(pool_id) for v in eligible}
    if (sum(amounts.values(), np.zeros(3, dtype=np.int64)) < deficit).any():
        return None
    wanted = deficit > 0
    order = sorted(eligible, key=partial(_cheapest_key, amounts, wanted, deficit))
    chosen: list[Victim] = []
    freed = np.zeros(3, dtype=np.int64)
    for v in order:
        chosen.append(v)
        freed += amounts[v.task_id]
        if (freed >= deficit).all():
            break
    # Spare whoever is not needed after all: highest priority, smallest, oldest first.
    for v in reversed(list(chosen)):
        rest = freed - amounts[v.task_id]
        if (rest >= deficit).all():
            chosen.remove(v)
            freed = rest
    return tuple(chosen)


#: Picks a pool's victims: (free, need, eligible, pool id) -> the set, () or None
#: (:func:`victims_cheapest`'s contract).
Cheapest = Callable[[np.ndarray, np.ndarray, Sequence[Victim], str], tuple[Victim, ...] | None]


def _holds(
    members: Sequence[tuple[str, int]],
    victims: Sequence[Victim],
    req: np.ndarray,
) -> tuple[tuple[str, int, Vector], ...]:
    """Return per member pool what the preemptor holds now: its need less what its victims
    there free (the rest of the need is free capacity, by construction of the sets)."""
    out = []
    for pool_id, count in members:
        freed = sum((v.amount_on(pool_id) for v in victims), np.zeros(3, dtype=np.int64))
        now = np.maximum(req * count - freed, 0)
        out.append((pool_id, count, (int(now[0]), int(now[1]), int(now[2]))))
    return tuple(out)


def plan_preemption(
    spec: CompiledSpec,
    snapshot: Snapshot,
    victims: VictimIndex,
    *,
    assumed: Assumed | None = None,
    taken: Collection[str] = frozenset(),
    holds: dict[str, Vector] | None = None,
    explain: bool = False,
    profile: Profile | None = None,
) -> Preemption | None:
    """Plan the cheapest preemption that would let ``spec`` fit, or None (see the module doc).

    ``taken`` are victims already claimed by other preemptors (in this pass). With
    ``explain=True`` the result lists every candidate pool with its cheapest set.
    """
    if not spec.may_preempt:
        return None
    idx, total, cycle = feasible_but_capacity(spec, snapshot, assumed=assumed, holds=holds,
                                              profile=profile)
    if len(idx) == 0:
        return None
    req = cycle.req
    free_all = cycle.available(idx)
    eligible = partial(_eligible, victims, spec.tenant_id, spec.priority, taken)

    if not spec.is_gang:
        return plan_single(snapshot, idx, total, free_all, req, eligible,
                           cheapest=victims_cheapest, explain=explain)
    return plan_gang(spec, snapshot, idx, total, free_all, req, eligible, explain=explain)


def _eligible(victims: VictimIndex, tenant_id: str, priority: int, taken: Collection[str],
              pool: int) -> list[Victim]:
    """Return the victims on ``pool`` that a task of ``tenant_id`` at ``priority`` may take:
    its tenant's, of a lower priority, not ``taken`` by another preemptor."""
    return [v for v in victims.on(pool, tenant_id)
            if v.priority < priority and v.task_id not in taken]


def plan_single(
    snapshot: Snapshot,
    idx: np.ndarray,
    total: np.ndarray,
    free_all: np.ndarray,
    req: np.ndarray,
    eligible: Callable[[int], Sequence[Victim]],
    *,
    cheapest: Callable[
        [np.ndarray, np.ndarray, Sequence[Victim], str], tuple[Victim, ...] | None],
    explain: bool = False,
) -> Preemption | None:
    """Plan a single task's preemption: on each pool (``idx``, totals ``total``, free
    ``free_all``) the set ``cheapest`` picks from ``eligible(i)``; the cheapest set wins,
    then the higher total, then the pool order. Reclaim plans with its own ``cheapest``."""
    ids = snapshot.ids
    options: list[tuple[tuple, float, int, PoolVictims]] = []
    for pos, i in enumerate(idx.tolist()):
        victims = eligible(i)
        if not victims:
            continue
        chosen = cheapest(free_all[pos], req, victims, ids[i])
        if not chosen:  # None: no room even so; (): fits already (select places it)
            continue
        pv = PoolVictims(ids[i], float(total[pos]), chosen, victims_key(chosen))
        options.append((pv.key, -pv.score, i, pv))
    if not options:
        return None
    options.sort(key=lambda o: o[:3])
    best = options[0][3]
    members = ((best.pool_id, 1),)
    return Preemption(
        members, best.victims, _holds(members, best.victims, req),
        tuple(o[3] for o in options) if explain else (),
    )


def plan_gang(
    spec: CompiledSpec,
    snapshot: Snapshot,
    idx: np.ndarray,
    total: np.ndarray,
    free_all: np.ndarray,
    req: np.ndarray,
    eligible: Callable[[int], list[Victim]],
    *,
    cheapest: Cheapest = victims_cheapest,
    explain: bool = False,
) -> Preemption | None:
    """Plan a gang's displacement for all its members or none: one plan (``place_gang``)
    over the room each pool would have with every victim ``eligible`` there (by snapshot
    position) gone, then ``cheapest`` picks each pool's set of the plan, in plan order.

    ``idx``, ``total`` and ``free_all`` are ``feasible_but_capacity``'s pools, scores and
    free capacity. Preemption and reclaim (:mod:`app.scheduling.reclaim`) share it; reclaim's
    ``cheapest`` may refuse a pool (its victim tenants' borrowed budgets), and then there is
    no plan.
    """
    ids = snapshot.ids
    room = free_all.copy()
    for pos, i in enumerate(idx.tolist()):
        for v in eligible(i):
            room[pos] += v.amount_on(ids[i])
    positive = req > 0
    slots = (np.maximum(room[:, positive], 0) // req[positive]).min(axis=1)
    chosen = place_gang(
        spec.members, slots, min_pools=spec.min_pools, max_per_pool=spec.max_per_pool
    )
    if chosen is None:
        return None
    members = tuple((ids[int(idx[p])], c) for p, c in chosen)
    picked: list[Victim] = []
    candidates: list[PoolVictims] = []
    for p, count in chosen:
        i = int(idx[p])
        # Victims chosen for earlier pools free their members here too (gang victims).
        free = free_all[p] + sum(
            (v.amount_on(ids[i]) for v in picked), np.zeros(3, dtype=np.int64)
        )
        pool_set = cheapest(
            free, req * count, [v for v in eligible(i) if v not in picked], ids[i]
        )
        if pool_set is None:  # a preemption always has a set here (the room above)
            return None
        picked.extend(pool_set)
        candidates.append(
            PoolVictims(ids[i], float(total[p]), pool_set, victims_key(pool_set))
        )
    if not picked:
        return None  # it fits without evicting anyone: select places it
    return Preemption(
        members, tuple(picked), _holds(members, picked, req),
        tuple(candidates) if explain else (),
    )
