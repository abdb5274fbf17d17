"""The framework: one pipeline decides every task — filter, score, rank.

:func:`decide` runs it (the plugins' base classes are in :mod:`app.scheduling.plugins.base`,
the reason codes in :mod:`app.scheduling.reasons`):

0. **Quota** (:mod:`app.scheduling.plugins.quota`, when a :class:`QuotaBook` is given): a
   task over its tenant's quota is refused before any pool is looked at.
1. **PreFilter** (:func:`app.scheduling.prefilter.class_state`): the pools past the filters
   that read only the spec's placement class and its tenant's audience, their rejection
   counts and the class-scope scores, computed once per class and snapshot.
2. **Filter**: the remaining filters in profile order over the numpy arrays of the pools
   still standing; each pool stops at its first rejection, rejections are counted per code.
3. **Score**: every score plugin that applies, over the feasible pools, normalized to 0..100,
   times its weight, summed in profile order (a class-scope score's values come from the
   class state while no per-task filter removed a pool).
4. **Rank**: total descending, then pool id ascending; a gang places its members on the
   ranked pools (:func:`app.scheduling.gangs.place_gang`).

:func:`select` is :func:`decide` with the decision always as a :class:`Result`. With
``explain=True`` the same pass records every pool's rejection and every candidate's
components; nothing is computed a second way for the explanation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np

from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle
from app.scheduling.gangs import place_gang
from app.scheduling.plugins import names
from app.scheduling.plugins.base import ScorePlugin
from app.scheduling.plugins.quota import QuotaBook
from app.scheduling.plugins.registry import Profile
from app.scheduling.plugins.registry import profile as shipped
from app.scheduling.prefilter import ClassState, class_state
from app.scheduling.reasons import CODE, PASS, Reason
from app.scheduling.results import (
    Built,
    Candidate,
    NoPlacement,
    Placement,
    Ranked,
    Rejection,
    Rejections,
    Result,
    ScoreComponent,
)
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from app.scheduling.stages import (
    N_REASONS,
    NO_VISIBLE_POOL,
    WAKE_POOLS_MAX,
    best,
    counts_map,
    no_placement,
    rank,
)

__all__ = ["WAKE_POOLS_MAX", "decide", "feasible_but_capacity", "select"]

_NONE = np.empty(0, dtype=np.intp)
_NO_POOL = Result(None, reason=NoPlacement(Reason.TENANT_NOT_ALLOWED, NO_VISIBLE_POOL, {}))


def select(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    explain: bool = False,
    top_k: int = 5,
    holds: Mapping[str, tuple[int, int, int]] | None = None,
    quotas: QuotaBook | None = None,
    profile: Profile | None = None,
) -> Result:
    """Decide where ``spec`` goes on ``snapshot`` (plus ``assumed``), without side effects;
    :func:`decide` says what the result holds."""
    out = decide(spec, snapshot, assumed=assumed, explain=explain, top_k=top_k, holds=holds,
                 quotas=quotas, profile=profile)
    return out.result() if isinstance(out, Ranked) else out


def decide(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    explain: bool = False,
    top_k: int = 5,
    holds: Mapping[str, tuple[int, int, int]] | None = None,
    quotas: QuotaBook | None = None,
    profile: Profile | None = None,
    components: int | None = None,
) -> Result | Ranked:
    """Decide where ``spec`` goes on ``snapshot`` (plus ``assumed``), without side effects.

    With ``explain=False`` (the reconciler's hot path) a single-member placement comes as
    :class:`Ranked` (the best ``top_k`` pools as plain values, the placement's components;
    its ``result()`` is the :class:`Result`), a gang's or a miss as a :class:`Result` whose
    ``candidates`` hold the best ``top_k`` pools and ``rejected`` is empty. With
    ``explain=True`` every feasible pool is a candidate with its components and every visible
    rejected pool is listed with its reason. ``holds`` is capacity the task itself holds per
    pool (a preemptor's nominated capacity): free for this task, used for every other.
    ``quotas`` is the pass's quota book: a task over its tenant's quota fits nowhere.
    ``profile`` is the plugins that decide (default: the shipped profile of the snapshot's
    strategy). ``components`` limits the explained candidates that carry their score
    components to the best that many (None: all; the placement always carries them).
    """
    if spec.tenant_id not in snapshot.audience:
        return _NO_POOL
    if quotas is not None:
        refused = quotas.refuse(spec.tenant_id, spec.runtime_class, spec.total_requests)
        if refused is not None:
            return Result(None, reason=refused)
    state = class_state(profile or shipped(snapshot.strategy), spec, snapshot)
    cycle = Cycle(spec, snapshot, assumed, holds)
    pools, counts, near, code_at = _filter(state, cycle, explain=explain)

    rejected: Sequence[Rejection] = ()
    if code_at is not None:
        visible = state.visible
        at = visible[code_at[visible] != PASS]
        rejected = Rejections(snapshot.ids, at, code_at[at])
    rejections = state.rejections if counts is state.counts else counts_map(counts)
    if len(pools) == 0:
        return Result(
            None,
            rejected=rejected,
            rejection_counts=rejections,
            reason=no_placement(counts, _near(cycle, near), snapshot),
        )

    applied, total = _score(state, cycle, pools)
    if not (explain or spec.is_gang):
        return _ranked(cycle, pools, applied, total, top_k, rejections)

    return _explained(cycle, pools, applied, total, counts=counts, near=near,
                      rejected=rejected, rejections=rejections, explain=explain, top_k=top_k,
                      components=components)


def _explained(
    cycle: Cycle, pools: np.ndarray, applied: list, total: np.ndarray, *, counts: np.ndarray,
    near: np.ndarray, rejected: Sequence[Rejection], rejections: Mapping[Reason, int],
    explain: bool, top_k: int, components: int | None = None,
) -> Result:
    """Return the ranked :class:`Result` of a gang, or of any spec with ``explain``: every
    candidate (with its components when explained) and the members' placement."""
    spec, snapshot = cycle.spec, cycle.snapshot
    order = rank(total)
    depth = len(order) if components is None else components
    # Module functions, not closures: compiled, a closure and its environment would hold each
    # other (and the pass's snapshot) until the collector ran.
    candidate = partial(_candidate, cycle, pools, applied, total)

    if not spec.is_gang:
        ranked = order.tolist()
        candidates: Sequence[Candidate] = Built(
            len(ranked), partial(_ranked_candidate, candidate, ranked, depth))
        head = candidates[0]
        members: tuple[tuple[str, int], ...] = ((head.pool_id, 1),)
        alternatives = tuple(candidates[1:max(top_k, 1)])
    else:
        slots = cycle.slots(pools[order])
        chosen = place_gang(
            spec.members, slots, min_pools=spec.min_pools, max_per_pool=spec.max_per_pool
        )
        if chosen is None:
            counts = counts.copy()
            counts[CODE[Reason.GANG_UNSATISFIABLE]] += len(pools)
            return Result(
                None,
                rejected=rejected,
                rejection_counts=counts_map(counts),
                # The pools that fit a member are closer than any rejected one.
                reason=no_placement(
                    counts, np.concatenate((_near(cycle, near), pools)), snapshot
                ),
            )
        head = candidate(int(order[chosen[0][0]]), True)
        members = tuple((snapshot.ids[int(pools[order[p]])], c) for p, c in chosen)
        limit = len(order) if explain else top_k
        picked = {p for p, _ in chosen}
        rest = [candidate(int(order[p]), explain and p < depth)
                for p in range(min(limit, len(order)))]
        alternatives = tuple(c for p, c in enumerate(rest) if p not in picked)[: max(top_k - 1, 0)]
        candidates = (head, *(c for p, c in enumerate(rest) if p != chosen[0][0]))
    placement = Placement(head.pool_id, head.score, head.components, members, alternatives)
    return Result(
        placement, candidates=candidates, rejected=rejected, rejection_counts=rejections
    )


def _candidate(cycle: Cycle, pools: np.ndarray, applied: list, total: np.ndarray, pos: int,
               detail: bool) -> Candidate:
    """Return the candidate at position ``pos`` of ``pools``, with its components when
    ``detail``."""
    i = int(pools[pos])
    comps: tuple[ScoreComponent, ...] = ()
    if detail:
        cycle.describing(pools, pos)
        comps = tuple(
            ScoreComponent(p.NAME, v.item(pos) * w, p.describe(cycle, i, v.item(pos)))
            for p, w, v in applied
        )
    return Candidate(cycle.snapshot.ids[i], total.item(pos), comps)


def _ranked_candidate(candidate: Callable[[int, bool], Candidate], ranked: list[int],
                      depth: int, n: int) -> Candidate:
    """Return the ``n``-th ranked candidate (with its components within ``depth``)."""
    return candidate(ranked[n], n == 0 or n < depth)


def feasible_but_capacity(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    holds: Mapping[str, tuple[int, int, int]] | None = None,
    profile: Profile | None = None,
) -> tuple[np.ndarray, np.ndarray, Cycle]:
    """Return the pools that pass every filter except capacity, ranked as ``select`` ranks
    (total descending, then pool id), their totals, and the cycle they were scored in.

    Preemption planning starts here: only these pools could take the task once lower-priority
    tasks left them.
    """
    cycle = Cycle(spec, snapshot, assumed, holds)
    empty = np.zeros(0, dtype=np.intp)
    if spec.tenant_id not in snapshot.audience:
        return empty, np.zeros(0), cycle
    state = class_state(profile or shipped(snapshot.strategy), spec, snapshot)
    pools = _filter(state, cycle, explain=False, without=names.CAPACITY)[0]
    if len(pools) == 0:
        return empty, np.zeros(0), cycle
    total = _score(state, cycle, pools)[1]
    order = rank(total)
    return pools[order], total[order], cycle


def _filter(
    state: ClassState, cycle: Cycle, *, explain: bool, without: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Run the per-task filters from the class state; return the feasible pools, the
    rejection counts (the class state's own array when no pool was rejected per task), the
    pools capacity rejected (:func:`_near` keeps those whose totals could hold a member), and
    with ``explain`` each pool's code (PASS or its rejection), else None."""
    snapshot = cycle.snapshot
    pools = state.pools
    cycle.class_pools = (pools, state.capacity_rows(snapshot), state.prescore)
    counts = state.counts
    near = _NONE
    code_at = None
    if explain:
        code_at = np.full(snapshot.n, PASS, dtype=np.int16)
        code_at[state.visible] = state.codes
    for f in state.task_filters:
        if len(pools) == 0:
            break
        if f.NAME == without:
            continue
        codes = f.filter_many(cycle, pools)
        if codes is None:
            continue
        bad = codes != PASS
        counts = counts + np.bincount(codes[bad], minlength=N_REASONS)
        if f.NAME == names.CAPACITY:
            near = pools[bad]
        if code_at is not None:
            code_at[pools[bad]] = codes[bad]
        keep = ~bad
        kept = pools[keep]
        cycle.narrow(pools, keep, kept)
        pools = kept
    return pools, counts, near, code_at


def _near(cycle: Cycle, rejected: np.ndarray) -> np.ndarray:
    """Return the pools of ``rejected`` (by capacity) whose totals could hold a member: only
    they can be helped by released capacity (asked only when the task fits nowhere)."""
    if len(rejected) == 0:
        return rejected
    cap = cycle.snapshot.cap.take(rejected, axis=0)
    return rejected[(cap >= cycle.req).all(axis=1)]


def _score(
    state: ClassState, cycle: Cycle, pools: np.ndarray
) -> tuple[list[tuple[ScorePlugin, int, np.ndarray]], np.ndarray]:
    """Return the applied (plugin, weight, 0..100 values) and the weighted totals, summed in
    profile order."""
    whole = pools is state.pools
    applied = []
    for plugin, weight, class_values, asks, normalizes in state.scores:
        if class_values is not None:
            if not whole:
                class_values = plugin.normalize(cycle, plugin.score_many(cycle, pools))
            applied.append((plugin, weight, class_values))
        elif not asks or plugin.applies(cycle):
            values = plugin.score_many(cycle, pools)
            applied.append((plugin, weight,
                            plugin.normalize(cycle, values) if normalizes else values))
    if not applied:
        return applied, np.zeros(len(pools), dtype=np.float64)
    # A new array from the first two weighted values (a weight of 1 multiplies nothing),
    # then the others added to it in profile order.
    first = applied[0][2] if applied[0][1] == 1 else applied[0][2] * applied[0][1]
    if len(applied) == 1:
        return applied, first.copy() if first is applied[0][2] else first
    _, weight, values = applied[1]
    total = first + (values if weight == 1 else values * weight)
    for _, weight, values in applied[2:]:
        total += values if weight == 1 else values * weight
    return applied, total


def _ranked(
    cycle: Cycle,
    pools: np.ndarray,
    applied: list[tuple[ScorePlugin, int, np.ndarray]],
    total: np.ndarray,
    top_k: int,
    rejections: Mapping[Reason, int],
) -> Ranked:
    """Return the best ``top_k`` of ``pools`` as plain values, with the placement's
    components as its plugins describe them."""
    ranked = best(total, top_k)
    head = ranked[0]
    pool = cycle.describing(pools, head)
    parts = []
    for plugin, weight, values in applied:
        value = values.item(head)
        parts.append((plugin.NAME, value * weight, plugin.describe(cycle, pool, value)))
    ids = cycle.snapshot.ids
    chosen = [ids[pools.item(p)] for p in ranked]
    return Ranked(chosen, [total.item(p) for p in ranked], tuple(parts), top_k, rejections)
