"""Nomination planning: the pools a starving task would take if lower-ranked work were gone.

Pure, like ``select``, and made of it: the question "where would this task fit if its pools
were empty of work ranked below it" is ``decide`` on the pass's snapshot with that work's
reservations counted as capacity the task holds (the ``holds`` of
:func:`app.scheduling.framework.decide`: free for this task only). Work ranked above it
stays where it is. For a gang the answer is the plan the gang planner makes on that room.

The result is the members per pool, what they need there, and the part of the need that is
free now (held at once; the rest is held as the leases on those pools end).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from app.scheduling.assumed import Assumed
from app.scheduling.framework import decide
from app.scheduling.plugins.registry import Profile
from app.scheduling.records import Vector, vector_sum
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

__all__ = ["NominationPlan", "plan_nomination"]



@dataclass(frozen=True, slots=True)
class NominationPlan:
    """The pools of a nomination: (pool id, members, need, free now) per pool."""

    pools: tuple[tuple[str, int, Vector, Vector], ...]

    @property
    def need(self) -> Vector:
        """Return the need summed over the pools."""
        return vector_sum(p[2] for p in self.pools)

    @property
    def free(self) -> Vector:
        """Return what is held at once, summed over the pools."""
        return vector_sum(p[3] for p in self.pools)


def plan_nomination(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    lower: Mapping[str, Vector],
    assumed: Assumed | None = None,
    exclude: frozenset[str] = frozenset(),
    profile: Profile | None = None,
) -> NominationPlan | None:
    """Plan the nomination of ``spec``: where ``select`` places it when the reservations of
    lower-ranked work (``lower``, per pool) are free for it; None when it would not fit even
    so, or when a chosen pool is in ``exclude`` (nominated for another task).

    The free part of each pool's need is read from ``assumed`` (the pass's decisions so
    far) when given, else from the snapshot."""
    outcome = decide(spec, snapshot, assumed=None, top_k=1, holds=dict(lower) or None,
                     profile=profile)
    members = outcome.members
    if members is None or any(p in exclude for p, _ in members):
        return None
    req = np.array(spec.requests, dtype=np.int64)
    used = snapshot.reserved if assumed is None else assumed.used
    pools = []
    for pool_id, count in members:
        i = snapshot.pos[pool_id]
        need = req * count
        free = np.minimum(np.maximum(snapshot.cap[i] - used[i], 0), need)
        pools.append((pool_id, count, _vector(need), _vector(free)))
    return NominationPlan(tuple(pools))


def _vector(a: np.ndarray) -> Vector:
    return (int(a[0]), int(a[1]), int(a[2]))
