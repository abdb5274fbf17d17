"""The lean select with affinity terms: single-member specs with required or preferred terms.

About 5% of the benchmark mix (preferred affinity; 10% more with ``--mix antiaffinity``,
required anti-affinity) carries affinity terms. Their filters up to capacity are those of a
lean spec of the same class, so :func:`decide` starts from the lean select's per-class memo
(:func:`app.scheduling.lean.class_of`: the pools past every filter but capacity, their
rejection counts and capacities) and adds per task only what the terms change:

    used + request > capacity      -> capacity rejections (first lacking dimension), as lean
    required terms                 -> required affinity over the pools that fit (the plugin)
    scores                         -> the profile's score plugins over the pools left, the
                                      load score from the rows at hand
    rank                           -> top_k, the placement's components

with the full select's arithmetic, in its order, so results are identical
(tests/scheduling/test_terms.py replays the bench datasets through both). The placement comes
as :class:`~app.scheduling.results.Ranked`, as a lean one does.

:func:`covers` says which calls may take this path: one member, no held capacity, no
``explain`` (gangs and explanations go through :func:`app.scheduling.framework.select_full`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from app.scheduling.assumed import Assumed, request_row
from app.scheduling.cycle import Cycle
from app.scheduling.lean import capacity_rejections, class_of
from app.scheduling.plugins import names
from app.scheduling.plugins.least_loaded import dominant_and_mean
from app.scheduling.plugins.registry import Profile, profile
from app.scheduling.reasons import PASS
from app.scheduling.results import Ranked, Result
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from app.scheduling.stages import N_REASONS, counts_map, no_placement_result, rank

__all__ = ["covers", "decide"]

_NONE = np.empty(0, dtype=np.intp)
_LOAD = frozenset({names.LEAST_LOADED, names.MOST_LOADED})
#: The term-less spec of each (tenant, placement class): what the lean class is built from.
_BARE: dict[tuple, CompiledSpec] = {}


def covers(spec: CompiledSpec, holds: Mapping | None = None, *, explain: bool = False) -> bool:
    """Return whether :func:`decide` decides this call exactly as the full select would."""
    return not explain and not holds and spec.members == 1 and spec.min_pools == 1


def _bare(spec: CompiledSpec) -> CompiledSpec:
    """Return a spec of ``spec``'s tenant and placement class without affinity terms (the
    lean class's filters up to capacity do not read the terms; its builder refuses them)."""
    key = (spec.tenant_id, spec.placement_class)
    bare = _BARE.get(key)
    if bare is None:
        if len(_BARE) >= 4096:
            _BARE.clear()
        bare = _BARE[key] = replace(spec, task_id=None, required=(), preferred=())
    return bare


def _required(prof: Profile):
    """Return the profile's required-affinity filter, checking that it is the last filter and
    capacity the one before it (the order :func:`decide` applies them in)."""
    *_, cap, req = prof.filters
    if cap.NAME != names.CAPACITY or req.NAME != names.REQUIRED_AFFINITY:  # pragma: no cover
        raise AssertionError("the terms select expects capacity, then required affinity, last")
    return req


def decide(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    top_k: int = 5,
) -> Ranked | Result:
    """Decide where ``spec`` goes, for a call :func:`covers` accepts: a placement as
    :class:`Ranked` (whose :meth:`~Ranked.result` is the full select's result with
    ``explain=False``), or the full select's result of a task that fits nowhere."""
    if spec.tenant_id not in snapshot.audience:
        return no_placement_result(None, _NONE, snapshot)
    prof = profile(snapshot.strategy)
    c = class_of(prof, _bare(spec), snapshot)
    idx = c.idx
    if len(idx) == 0:
        return no_placement_result(c.counts, _NONE, snapshot)
    req = request_row(spec.requests)
    need = (assumed.used if assumed is not None else snapshot.reserved).take(idx, axis=0)
    need += req
    cap = c.cap
    lack = need > cap
    counts = c.counts
    near = _NONE
    pools = idx
    if np.count_nonzero(lack):
        bad, counts = capacity_rejections(lack, counts)
        # Woken by released capacity: the pools whose totals could hold the task.
        near = idx[bad & (cap >= req).all(axis=1)]
        fit = ~bad
        pools, need, cap = idx[fit], need[fit], cap[fit]
        if len(pools) == 0:
            return no_placement_result(counts, near, snapshot)

    cycle = Cycle(spec, snapshot, assumed)
    if spec.required:
        codes = _required(prof).filter_many(cycle, pools)
        if codes is not None:
            bad = codes != PASS
            counts = counts + np.bincount(codes[bad], minlength=N_REASONS)
            fit = ~bad
            pools, need, cap = pools[fit], need[fit], cap[fit]
            if len(pools) == 0:
                return no_placement_result(counts, near, snapshot)

    # least_loaded.projected_utilization, on the rows at hand.
    offered = cap > 0
    util = np.divide(need, cap, out=np.zeros(cap.shape, dtype=np.float64), where=offered)
    np.minimum(np.maximum(util, 0.0, out=util), 1.0, out=util)
    dominant, mean = dominant_and_mean(util, offered)
    # Weighted sum in the profile's order, from zero, exactly as the full select adds it.
    total = np.zeros(len(pools), dtype=np.float64)
    applied = []
    raw = None
    for plugin, weight in prof.scores:
        name = plugin.NAME
        if not plugin.applies(cycle):
            continue
        if name in _LOAD:
            v = plugin.from_utilization(dominant, mean)
        elif name == names.COST and pools is idx:
            v = c.cost_score  # the class's: the same min-max over the same pools
        elif name == names.PREFERRED_AFFINITY:
            raw = plugin.score_many(cycle, pools)
            v = plugin.normalize(cycle, raw)
        else:
            v = plugin.normalize(cycle, plugin.score_many(cycle, pools))
        # ``v * 1`` is ``v`` to the bit: the same sum without the product's copy.
        total += v if weight == 1 else v * weight
        applied.append((plugin, weight, v))
    order = rank(pools, total, top_k)

    ranked = order.tolist()
    head = ranked[0]
    pool = int(pools[head])
    parts = []
    for plugin, weight, v in applied:
        value = v.item(head)
        if plugin.NAME in _LOAD:
            reason = plugin.reason(dominant.item(head), mean.item(head))
        elif plugin.NAME == names.PREFERRED_AFFINITY:
            reason = plugin.reason(raw.item(head))
        else:
            reason = plugin.describe(cycle, pool, value)
        parts.append((plugin.NAME, value * weight, reason))
    ids = snapshot.ids
    chosen = [ids[i] for i in pools.take(order).tolist()]
    rejections = c.counts_map if counts is c.counts else counts_map(counts)
    return Ranked(chosen, total.take(order).tolist(), tuple(parts), top_k, rejections)
