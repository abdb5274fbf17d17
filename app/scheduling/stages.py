"""The steps both selects share: the memoized static filters, the ranking, and the result of
a task that fits nowhere (:mod:`app.scheduling.framework` and :mod:`app.scheduling.lean`)."""

from __future__ import annotations

import numpy as np

from app.scheduling.cycle import Cycle
from app.scheduling.plugins.registry import Profile
from app.scheduling.reasons import PASS, REASONS, Reason, describe_counts, headline
from app.scheduling.results import NoPlacement, Result
from app.scheduling.snapshot import Snapshot

__all__ = [
    "N_REASONS",
    "NO_VISIBLE_POOL",
    "WAKE_POOLS_MAX",
    "counts_map",
    "no_placement",
    "no_placement_result",
    "rank",
    "static_filters",
]

NO_VISIBLE_POOL = "no pool is available to this tenant"
#: Most pools a "no placement" result names as those whose released capacity could help
#: (``NoPlacement.wake_pools``); beyond it the wake condition is the runtime class as a whole.
WAKE_POOLS_MAX = 16
N_REASONS = len(REASONS)
#: Up to this many feasible pools, ranking sorts them all rather than selecting the top k.
RANK_SORT_MAX = 256


def static_filters(prof: Profile, cycle: Cycle, visible: np.ndarray) -> tuple:
    """Return (passing indexes, counts, codes of the visible pools) of the static filters,
    memoized per (audience, runtime class) on the snapshot; ``visible`` must be the tenant's
    visible pools, not empty."""

    def build() -> tuple:
        codes = np.full(len(visible), PASS, dtype=np.int16)
        alive = np.ones(len(visible), dtype=bool)
        for f in prof.filters:
            if not f.STATIC:
                continue
            pos = np.flatnonzero(alive)
            out = f.filter_many(cycle, visible[pos])
            if out is None:
                continue
            bad = out != PASS
            codes[pos[bad]] = out[bad]
            alive[pos[bad]] = False
        counts = np.bincount(codes[~alive], minlength=N_REASONS).astype(np.int64)
        return visible[alive], counts, codes

    # Tenants that see the same pools (one audience) get the same verdicts: tenant access
    # passes every visible pool and the other static filters do not read the tenant.
    snapshot = cycle.snapshot
    key = ("static", snapshot.audience[cycle.spec.tenant_id], cycle.spec.runtime_class)
    return snapshot.memoized(key, build)


def rank(idx: np.ndarray, total: np.ndarray, k: int | None) -> np.ndarray:
    """Return positions into ``idx`` by total descending, then pool id (index) ascending."""
    n = len(idx)
    # The ndarray methods: np.argsort, np.partition and np.flatnonzero add Python-level
    # wrappers per call (selecting the top k this way beats sorting from ~300 pools on).
    if k is None or n <= k:
        return (-total).argsort(kind="stable")  # idx is ascending: stable keeps id order
    if n <= RANK_SORT_MAX:
        # The same first k as below, in fewer calls: small sorts cost less than selecting.
        return (-total).argsort(kind="stable")[:k]
    part = total.copy()
    part.partition(n - k)
    thr = part[n - k]
    sel = (total >= thr).nonzero()[0]
    return sel[(-total.take(sel)).argsort(kind="stable")[:k]]


def counts_map(counts: np.ndarray) -> dict[Reason, int]:
    """Return the nonzero rejection counts of a per-code array, by reason."""
    # ``nonzero`` on the 1-d array: np.flatnonzero adds two Python-level calls.
    return {REASONS[i]: int(counts[i]) for i in counts.nonzero()[0].tolist()}


def no_placement(counts: np.ndarray, near: np.ndarray, snapshot: Snapshot) -> NoPlacement:
    """Return the closest-miss reason of ``counts``; ``near`` are the snapshot indexes of the
    pools that only capacity kept from fitting (woken when capacity frees up there)."""
    by_code = counts_map(counts)
    code = headline(by_code) or Reason.TENANT_NOT_ALLOWED
    wake = (
        tuple(snapshot.ids[i] for i in sorted(near.tolist()))
        if len(near) <= WAKE_POOLS_MAX else None
    )
    return NoPlacement(
        code, describe_counts(by_code), {str(r): n for r, n in by_code.items()}, wake
    )


def no_placement_result(
    counts: np.ndarray | None, near: np.ndarray, snapshot: Snapshot
) -> Result:
    """Return the result of a task that fits nowhere (``counts`` None: the tenant sees no
    pool), without per-pool rejections."""
    if counts is None:
        return Result(None, reason=NoPlacement(Reason.TENANT_NOT_ALLOWED, NO_VISIBLE_POOL, {}))
    return Result(
        None, rejection_counts=counts_map(counts), reason=no_placement(counts, near, snapshot)
    )
