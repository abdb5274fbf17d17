"""Gang placement: a lazy plan iterator and, per plan, a lazy candidate iterator.

A gang of N identical members is placed all-or-nothing. Plans are spreads in order of
preference — 1 pool × N, 2 pools × ⌈N/2⌉, …, N pools × 1 — restricted to ``min_pools`` and
``max_per_pool``. A plan over k pools puts ``N // k`` members on each pool and one more on
``N % k`` of them, so it needs k distinct pools with that many free member slots. Pools are
tried in ranked order; the first plan whose members all fit wins.

When no even spread fits, one last plan fills the ranked pools unevenly (:func:`fit_uneven`):
each pool in rank order takes as many members as it has room for (at most ``max_per_pool``),
keeping one member back for every further pool ``min_pools`` still asks for. Capacity that
exists is usable: 7 members fit on pools with room for 1, 2 and 4.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["Plan", "fit", "fit_uneven", "plan_candidates", "plans", "place_gang"]


@dataclass(frozen=True, slots=True)
class Plan:
    """A spread of ``members`` over exactly ``pools`` pools."""

    members: int
    pools: int

    @property
    def base(self) -> int:
        """Return the members every pool of the plan hosts at least."""
        return self.members // self.pools

    @property
    def extra(self) -> int:
        """Return how many pools host one member more than ``base``."""
        return self.members % self.pools

    @property
    def per_pool(self) -> int:
        """Return the most members any pool of the plan hosts (⌈members / pools⌉)."""
        return -(-self.members // self.pools)


def plans(
    members: int,
    *,
    min_pools: int = 1,
    max_per_pool: int | None = None,
    max_pools: int | None = None,
) -> Iterator[Plan]:
    """Yield the plans of a gang in order of preference, one at a time."""
    last = members if max_pools is None else min(members, max_pools)
    for k in range(max(min_pools, 1), last + 1):
        plan = Plan(members, k)
        if max_per_pool is not None and plan.per_pool > max_per_pool:
            continue
        yield plan


def plan_candidates(plan: Plan, slots: np.ndarray) -> Iterator[int]:
    """Yield, in ranked order, the positions of pools with room for at least ``plan.base``."""
    for pos in np.flatnonzero(slots >= plan.base):
        yield int(pos)


def fit(plan: Plan, slots: np.ndarray) -> tuple[tuple[int, int], ...] | None:
    """Return (ranked position, members) per pool if the plan fits, else None.

    Greedy in ranked order is exact here: a pool with room for ``base + 1`` takes one of the
    ``extra`` larger shares while any remain, and any pool with room for ``base`` takes a
    plain share; pools with room only for ``base`` can never take a larger share.
    """
    need_big = plan.extra
    need_small = plan.pools - plan.extra
    chosen: list[tuple[int, int]] = []
    for pos in plan_candidates(plan, slots):
        if need_big and slots[pos] >= plan.base + 1:
            chosen.append((pos, plan.base + 1))
            need_big -= 1
        elif need_small:
            chosen.append((pos, plan.base))
            need_small -= 1
        if not need_big and not need_small:
            return tuple(chosen)
    return None


def fit_uneven(
    members: int,
    slots: np.ndarray,
    *,
    min_pools: int = 1,
    max_per_pool: int | None = None,
) -> tuple[tuple[int, int], ...] | None:
    """Return (ranked position, members) per pool of the greedy uneven plan, or None.

    Walks the pools in ranked order; each takes ``min(room, max_per_pool, left - kept)``
    members, where ``kept`` is one member for every pool still needed to reach ``min_pools``.
    This fits whenever any assignment does: the pools with room for one member are at least
    ``min_pools`` and their room (capped by ``max_per_pool``) adds up to ``members``.
    """
    cap = members if max_per_pool is None else max_per_pool
    left = members
    chosen: list[tuple[int, int]] = []
    for pos in np.flatnonzero(slots >= 1):
        kept = max(min_pools - len(chosen) - 1, 0)
        take = min(int(slots[pos]), cap, left - kept)
        if take < 1:
            continue
        chosen.append((int(pos), take))
        left -= take
        if left == 0:
            return tuple(chosen) if len(chosen) >= min_pools else None
    return None


def place_gang(
    members: int,
    slots: np.ndarray,
    *,
    min_pools: int = 1,
    max_per_pool: int | None = None,
) -> tuple[tuple[int, int], ...] | None:
    """Return the members of the first plan that fits on pools with ``slots`` (ranked order):
    an even spread, else the last, uneven plan."""
    usable = int(np.count_nonzero(slots >= 1))
    for plan in plans(members, min_pools=min_pools, max_per_pool=max_per_pool, max_pools=usable):
        chosen = fit(plan, slots)
        if chosen is not None:
            return chosen
    if usable < min_pools:
        return None
    return fit_uneven(members, slots, min_pools=min_pools, max_per_pool=max_per_pool)
