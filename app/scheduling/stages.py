"""The pipeline's last steps: the ranking, and the result of a task that fits nowhere."""

from __future__ import annotations

import numpy as np

from app.scheduling.reasons import REASONS, STAGE, Reason, Stage, describe_counts, headline
from app.scheduling.results import NoPlacement, Result
from app.scheduling.snapshot import Snapshot

__all__ = [
    "N_REASONS",
    "NO_VISIBLE_POOL",
    "WAKE_POOLS_MAX",
    "counts_map",
    "no_placement",
    "no_placement_result",
    "best",
    "rank",
]

NO_VISIBLE_POOL = "no pool is available to this tenant"
#: Most pools a "no placement" result names as those whose released capacity could help
#: (``NoPlacement.wake_pools``); beyond it the wake condition is the runtime class as a whole.
WAKE_POOLS_MAX = 16
N_REASONS = len(REASONS)
#: From this many feasible pools, the best few are picked by repeated ``argmax`` (one pass
#: over the totals per pick) rather than by sorting them all.
RANK_PICK_MIN = 96
#: Most pools picked by repeated ``argmax``; beyond it the totals are partitioned.
RANK_PICK_MAX = 8


def rank(total: np.ndarray) -> np.ndarray:
    """Return the positions of ``total`` by total descending, then position ascending (the
    pools are in id order, so among equal totals the lowest id first)."""
    return (-total).argsort(kind="stable")


def best(total: np.ndarray, k: int) -> list[int]:
    """Return the first ``k`` positions of :func:`rank`."""
    n = len(total)
    if n <= k or n < RANK_PICK_MIN:
        return rank(total)[:k].tolist()
    if k <= RANK_PICK_MAX:
        # argmax gives the first of equal totals: the lowest position.
        left = total.copy()
        picked = []
        for _ in range(k):
            at = int(left.argmax())
            picked.append(at)
            left[at] = -np.inf
        return picked
    part = total.copy()
    part.partition(n - k)
    thr = part[n - k]
    sel = (total >= thr).nonzero()[0]
    return sel[(-total.take(sel)).argsort(kind="stable")[:k]].tolist()


def counts_map(counts: np.ndarray) -> dict[Reason, int]:
    """Return the nonzero rejection counts of a per-code array, by reason."""
    return {REASONS[i]: int(counts[i]) for i in counts.nonzero()[0].tolist()}


def no_placement(counts: np.ndarray, near: np.ndarray, snapshot: Snapshot) -> NoPlacement:
    """Return the closest-miss reason of ``counts``; ``near`` are the snapshot indexes of the
    pools that only capacity kept from fitting and whose totals could hold a member (woken
    when capacity frees up there). A capacity miss with no such pool is ``never_fits``."""
    by_code = counts_map(counts)
    code = headline(by_code) or Reason.TENANT_NOT_ALLOWED
    if STAGE[code] == Stage.CAPACITY and len(near) == 0:
        return NoPlacement(
            Reason.NEVER_FITS, describe_counts(by_code, never_fits=True),
            {str(r): n for r, n in by_code.items()}, (),
        )
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
