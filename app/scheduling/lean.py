"""The lean select: the reconciler's hot path for specs without affinity terms or gangs.

Most tasks (93% of the benchmark mix) name a runtime class, requests and at most regions, a
data residency, a pool selector and an artifact region. For them only capacity and the
scores that read usage change from one task to the next; everything else is a function of
the spec's **class** — tenant, runtime class, hard constraints, artifact region — and of the
snapshot. :func:`select_lean` therefore keeps, per class and snapshot (a memo entry of kind
``"lean"``), the pools that pass every filter but capacity, their rejection counts, their
capacities and the class's static scores (cost and artifact locality over the whole set),
and per task does only:

    used + request > capacity      -> capacity rejections (first lacking dimension)
    (used + request) / capacity    -> least or most loaded
    tenant members per domain      -> failure-domain spread
    cost, artifact locality        -> from the class (re-normalized only when capacity cut)
    rank                           -> top_k

in about twenty numpy calls instead of about ninety. Every value is computed with the same
arithmetic, in the same order, as :func:`app.scheduling.framework.select_full`, so results are
identical (tests/scheduling/test_lean.py replays the benchmark dataset through both). Score
reasons are rendered for the placement's pool only, by the plugins' own ``describe``.

:func:`covers` says which calls may take this path: no required or preferred affinity, one
member, no held capacity, no explanation of every pool (``explain=True`` lists every pool with
its reason: the full path does that).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle, tenant_domain_counts
from app.scheduling.plugins import names
from app.scheduling.plugins.base import minmax
from app.scheduling.plugins.registry import Profile, profile
from app.scheduling.reasons import CODE, PASS, Reason
from app.scheduling.results import Candidate, Placement, Result, ScoreComponent
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from app.scheduling.stages import (
    N_REASONS,
    counts_map,
    no_placement_result,
    rank,
    static_filters,
)

__all__ = ["covers", "select_lean"]

_CPU = CODE[Reason.INSUFFICIENT_CPU]
_MEMORY = CODE[Reason.INSUFFICIENT_MEMORY]
_LLM = CODE[Reason.INSUFFICIENT_LLM_SLOTS]
#: The scores a lean spec can get: every other one (preferred affinity) needs a term.
_LEAN_SCORES = frozenset({
    names.LEAST_LOADED, names.MOST_LOADED, names.COST, names.FAILURE_DOMAIN_SPREAD,
    names.ARTIFACT_LOCALITY,
})


def covers(spec: CompiledSpec, holds: Mapping | None = None, *, explain: bool = False) -> bool:
    """Return whether :func:`select_lean` decides this call exactly as the full select would."""
    return (
        not explain
        and not holds
        and not spec.required
        and not spec.preferred
        and spec.members == 1
        and spec.min_pools == 1
    )


class _Class:
    """What a spec class needs per task, computed once per snapshot."""

    __slots__ = (
        "idx", "counts", "counts_map", "cap", "offered", "dims", "cost", "cost_score",
        "art", "fd", "visible", "load", "scored",
    )


def _class(
    prof: Profile, spec: CompiledSpec, snapshot: Snapshot, assumed: Assumed | None
) -> _Class | None:
    """Return the memoized class of ``spec`` on ``snapshot``; None when the tenant sees no pool."""
    key = (
        "lean", spec.tenant_id, spec.runtime_class, spec.regions, spec.data_residency,
        spec.pool_selector, spec.artifact_region,
    )

    def build() -> _Class:
        c = _Class()
        cycle = Cycle(spec, snapshot, assumed)
        c.visible = visible = snapshot.visible(spec.tenant_id)
        if len(visible) == 0:
            c.idx = visible
            return c
        idx, static_counts, _ = static_filters(prof, cycle, visible)
        counts = static_counts.copy()
        passed_capacity = False
        for f in prof.filters:
            if f.STATIC or len(idx) == 0:
                continue
            if f.NAME == names.CAPACITY:
                passed_capacity = True
                continue
            codes = f.filter_many(cycle, idx)
            if codes is None:
                continue
            if passed_capacity:  # pragma: no cover - covers() keeps such filters silent
                raise AssertionError(f"filter {f.NAME} after capacity rejects a lean spec")
            bad = codes != PASS
            counts += np.bincount(codes[bad], minlength=N_REASONS)
            idx = idx[~bad]
        c.idx = idx
        c.counts = counts
        c.counts_map = counts_map(counts)
        c.cap = snapshot.cap[idx]
        c.offered = c.cap > 0
        c.dims = np.maximum(c.offered.sum(axis=1), 1)
        c.cost = snapshot.cost[idx]
        c.cost_score = minmax(c.cost, higher_is_better=False)
        c.fd = snapshot.fd[idx]
        c.art = None
        c.scored = []
        for plugin, weight in prof.scores:
            if plugin.NAME in (names.LEAST_LOADED, names.MOST_LOADED):
                c.load = plugin
            if plugin.applies(cycle):
                if plugin.NAME not in _LEAN_SCORES:  # pragma: no cover - covers() prevents it
                    raise AssertionError(f"score {plugin.NAME} applies to a lean spec")
                c.scored.append((plugin, weight))
        if spec.artifact_region is not None:
            c.art = snapshot.artifact_mask(spec.artifact_region)[idx] * 100.0
        return c

    return snapshot.memoized(key, build)


def select_lean(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    top_k: int = 5,
) -> Result:
    """Decide where ``spec`` goes, for a call :func:`covers` accepts (same result as the full
    select with ``explain=False``)."""
    prof = profile(snapshot.strategy)
    c = _class(prof, spec, snapshot, assumed)
    idx = c.idx
    if len(c.visible) == 0 or len(idx) == 0:
        return no_placement_result(c.counts if len(c.visible) else None, idx, snapshot)
    used = (assumed.used if assumed is not None else snapshot.reserved)[idx]
    need = used + np.array(spec.requests, dtype=np.int64)
    lack = need > c.cap
    if lack.any():
        bad = lack.any(axis=1)
        counts = c.counts.copy()
        first_cpu = lack[:, 0]
        first_mem = lack[:, 1] & ~first_cpu
        counts[_CPU] += int(first_cpu.sum())
        counts[_MEMORY] += int(first_mem.sum())
        counts[_LLM] += int((bad & ~first_cpu & ~first_mem).sum())
        fit = np.flatnonzero(~bad)
        if len(fit) == 0:
            near = idx[bad]
            near = near[(snapshot.cap[near] >= np.array(spec.requests)).all(axis=1)]
            return no_placement_result(counts, near, snapshot)
        rejections = counts_map(counts)
        pools = idx[fit]
        need = need[fit]
        cap = c.cap[fit]
        offered = c.offered[fit]
        dims = c.dims[fit]
        cost = minmax(c.cost[fit], higher_is_better=False)
        fd = c.fd[fit]
        art = None if c.art is None else c.art[fit]
    else:
        rejections = c.counts_map
        pools, cap, offered, dims = idx, c.cap, c.offered, c.dims
        cost, fd, art = c.cost_score, c.fd, c.art

    # Projected utilization (least_loaded.projected_utilization, on the rows already at hand).
    util = np.divide(need, cap, out=np.zeros(cap.shape, dtype=np.float64), where=offered)
    np.minimum(np.maximum(util, 0.0, out=util), 1.0, out=util)
    dominant = util.max(axis=1)
    mean = util.sum(axis=1) / dims
    load = c.load.from_utilization(dominant, mean)
    per_domain = tenant_domain_counts(snapshot, assumed, spec.tenant_id, "failureDomain")[1]
    spread = minmax(per_domain[fd].astype(np.float64), higher_is_better=False)
    values = {c.load.NAME: load, names.COST: cost, names.FAILURE_DOMAIN_SPREAD: spread,
              names.ARTIFACT_LOCALITY: art}
    # Weighted sum in the profile's order, from zero, exactly as the full select adds it.
    total = np.zeros(len(pools), dtype=np.float64)
    for p, w in c.scored:
        total += values[p.NAME] * w
    order = rank(pools, total, top_k)

    head = int(order[0])
    pool = int(pools[head])
    cycle = Cycle(spec, snapshot, assumed)
    cycle.notes[c.load.NAME] = (pools[head:head + 1], dominant[head:head + 1],
                                mean[head:head + 1])
    components = tuple(
        ScoreComponent(p.NAME, float(values[p.NAME][head]),
                       p.describe(cycle, pool, float(values[p.NAME][head])))
        for p, _w in c.scored
    )
    ids = snapshot.ids
    best = Candidate(ids[pool], float(total[head]), components)
    after = order[1:]
    rest = [
        Candidate(ids[i], s)
        for i, s in zip(pools[after].tolist(), total[after].tolist(), strict=True)
    ]
    placement = Placement(best.pool_id, best.score, components, ((best.pool_id, 1),),
                          tuple(rest[: max(top_k - 1, 0)]))
    return Result(placement, candidates=(best, *rest), rejection_counts=rejections)
