"""The framework: ``select`` — filter, score, rank (the plugins' base classes are in
:mod:`app.scheduling.plugins.base`, the reason codes in :mod:`app.scheduling.reasons`).

``select`` sends the calls :func:`app.scheduling.lean.covers` accepts (no affinity terms, one
member, no held capacity, no ``explain``) to the lean path, which decides them identically
in fewer steps, and every other call to :func:`select_full`.

:func:`select_full` evaluates only the pools the tenant can see. Filters that depend only on
the tenant and runtime class (tenant access, status, health, runtime class) are evaluated
once per audience (the tenants that see the same pools), runtime class and snapshot, and
memoized; the others run per task over numpy arrays of the pools still standing, each pool
stopping at its first rejection. Rejections are counted per code by a bincount; per-pool
explanations are built only with ``explain=True``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle
from app.scheduling.gangs import place_gang
from app.scheduling.lean import covers, decide, select_lean
from app.scheduling.plugins import names
from app.scheduling.plugins.registry import Profile, profile
from app.scheduling.reasons import CODE, PASS, REASONS, Reason
from app.scheduling.results import (
    Candidate,
    NoPlacement,
    Placement,
    Ranked,
    Rejection,
    Result,
    ScoreComponent,
)
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from app.scheduling.stages import (
    N_REASONS,
    NO_VISIBLE_POOL,
    WAKE_POOLS_MAX,
    counts_map,
    no_placement,
    rank,
    static_filters,
)
from app.scheduling.terms import covers as terms_covers
from app.scheduling.terms import decide as terms_decide

__all__ = ["WAKE_POOLS_MAX", "feasible_but_capacity", "select", "select_full", "select_ranked"]

_NONE = np.empty(0, dtype=np.intp)


def select(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    explain: bool = False,
    top_k: int = 5,
    holds: Mapping[str, tuple[int, int, int]] | None = None,
) -> Result:
    """Decide where ``spec`` goes on ``snapshot`` (plus ``assumed``), without side effects.

    The lean path (:mod:`app.scheduling.lean`) decides the calls it covers — no affinity
    terms, one member, no held capacity, no ``explain`` — with the same result; the others go
    through :func:`select_full`, whose documentation describes the result.
    """
    if covers(spec, holds, explain=explain):
        return select_lean(spec, snapshot, assumed=assumed, top_k=top_k)
    if terms_covers(spec, holds, explain=explain):
        out = terms_decide(spec, snapshot, assumed=assumed, top_k=top_k)
        return out.result() if isinstance(out, Ranked) else out
    return select_full(
        spec, snapshot, assumed=assumed, explain=explain, top_k=top_k, holds=holds
    )


def select_ranked(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    top_k: int = 5,
    holds: Mapping[str, tuple[int, int, int]] | None = None,
) -> Result | Ranked:
    """:func:`select` for the reconciler: a lean placement comes as :class:`Ranked` (plain
    values whose ``result()`` is what ``select`` returns; its document is built from them)."""
    if covers(spec, holds):
        return decide(spec, snapshot, assumed=assumed, top_k=top_k)
    if terms_covers(spec, holds):
        return terms_decide(spec, snapshot, assumed=assumed, top_k=top_k)
    return select_full(spec, snapshot, assumed=assumed, top_k=top_k, holds=holds)


def select_full(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    explain: bool = False,
    top_k: int = 5,
    holds: Mapping[str, tuple[int, int, int]] | None = None,
) -> Result:
    """Decide where ``spec`` goes on ``snapshot`` (plus ``assumed``), without side effects.

    With ``explain=False`` (the reconciler's hot path) ``candidates`` holds the best ``top_k``
    pools (the placement first; components on the placement only) and ``rejected`` is empty.
    With ``explain=True`` every feasible pool is a candidate with its components and every
    visible rejected pool is listed with its reason. ``holds`` is capacity the task itself holds
    per pool (a preemptor's nominated capacity): free for this task, used for every other.
    """
    prof = profile(snapshot.strategy)
    cycle = Cycle(spec, snapshot, assumed, holds)
    visible = snapshot.visible(spec.tenant_id)
    if len(visible) == 0:
        return Result(None, reason=NoPlacement(Reason.TENANT_NOT_ALLOWED, NO_VISIBLE_POOL, {}))

    idx, static_counts, static_codes = static_filters(prof, cycle, visible)
    counts = static_counts.copy()
    near = _NONE
    code_at = None
    if explain:
        code_at = np.full(snapshot.n, PASS, dtype=np.int16)
        code_at[visible] = static_codes
    for f in prof.filters:
        if f.STATIC or len(idx) == 0:
            continue
        codes = f.filter_many(cycle, idx)
        if codes is None:
            continue
        bad = codes != PASS
        counts += np.bincount(codes[bad], minlength=N_REASONS)
        if f.NAME == names.CAPACITY:
            # Only pools whose totals could hold a member can be helped by released capacity.
            near = idx[bad]
            near = near[(snapshot.cap[near] >= cycle.req).all(axis=1)]
        if code_at is not None:
            code_at[idx[bad]] = codes[bad]
        idx = idx[~bad]

    rejected: tuple[Rejection, ...] = ()
    if code_at is not None:
        rej = visible[code_at[visible] != PASS]
        rejected = tuple(
            Rejection(snapshot.ids[i], (str(REASONS[code_at[i]]),)) for i in rej.tolist()
        )
    if len(idx) == 0:
        return Result(
            None,
            rejected=rejected,
            rejection_counts=counts_map(counts),
            reason=no_placement(counts, near, snapshot),
        )

    applied, values, total = _score(prof, cycle, idx)
    gang = spec.is_gang
    order = rank(idx, total, None if (explain or gang) else top_k)

    def candidate(pos: int, detail: bool) -> Candidate:
        i = int(idx[pos])
        comps = ()
        if detail:
            comps = tuple(
                ScoreComponent(p.NAME, float(v[pos] * w), p.describe(cycle, i, float(v[pos])))
                for (p, w), v in zip(applied, values, strict=True)
            )
        return Candidate(snapshot.ids[i], float(total[pos]), comps)

    if not gang:
        head = candidate(int(order[0]), True)
        if explain:
            rest = [candidate(int(p), True) for p in order[1:]]
        else:
            # The hot path: scores only, read in bulk rather than element by element.
            after = order[1:]
            ids = snapshot.ids
            rest = [
                Candidate(ids[i], s)
                for i, s in zip(idx[after].tolist(), total[after].tolist(), strict=True)
            ]
        members = ((head.pool_id, 1),)
        alternatives = tuple(rest[: max(top_k - 1, 0)])
        candidates = (head, *rest)
    else:
        slots = cycle.slots(idx[order])
        chosen = place_gang(
            spec.members, slots, min_pools=spec.min_pools, max_per_pool=spec.max_per_pool
        )
        if chosen is None:
            counts[CODE[Reason.GANG_UNSATISFIABLE]] += len(idx)
            return Result(
                None,
                rejected=rejected,
                rejection_counts=counts_map(counts),
                # The pools that fit a member are closer than any rejected one.
                reason=no_placement(counts, np.concatenate((near, idx)), snapshot),
            )
        head = candidate(int(order[chosen[0][0]]), True)
        members = tuple((snapshot.ids[int(idx[order[p]])], c) for p, c in chosen)
        limit = len(order) if explain else top_k
        picked = {p for p, _ in chosen}
        rest = [candidate(int(order[p]), explain) for p in range(min(limit, len(order)))]
        alternatives = tuple(c for p, c in enumerate(rest) if p not in picked)[: max(top_k - 1, 0)]
        candidates = (head, *(c for p, c in enumerate(rest) if p != chosen[0][0]))
    placement = Placement(head.pool_id, head.score, head.components, members, alternatives)
    return Result(
        placement,
        candidates=candidates,
        rejected=rejected,
        rejection_counts=counts_map(counts),
    )


def feasible_but_capacity(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    holds: Mapping[str, tuple[int, int, int]] | None = None,
) -> tuple[np.ndarray, np.ndarray, Cycle]:
    """Return the pools that pass every filter except capacity, ranked as ``select`` ranks
    (total descending, then pool id), their totals, and the cycle they were scored in.

    Preemption planning starts here: only these pools could take the task once lower-priority
    tasks left them.
    """
    prof = profile(snapshot.strategy)
    cycle = Cycle(spec, snapshot, assumed, holds)
    visible = snapshot.visible(spec.tenant_id)
    empty = np.zeros(0, dtype=np.intp)
    if len(visible) == 0:
        return empty, np.zeros(0), cycle
    idx = static_filters(prof, cycle, visible)[0]
    for f in prof.filters:
        if f.STATIC or f.NAME == names.CAPACITY or len(idx) == 0:
            continue
        codes = f.filter_many(cycle, idx)
        if codes is not None:
            idx = idx[codes == PASS]
    if len(idx) == 0:
        return empty, np.zeros(0), cycle
    total = _score(prof, cycle, idx)[2]
    order = rank(idx, total, None)
    return idx[order], total[order], cycle


def _score(
    prof: Profile, cycle: Cycle, idx: np.ndarray
) -> tuple[list, list[np.ndarray], np.ndarray]:
    """Return the applied (plugin, weight) pairs, their 0..100 values, and weighted totals."""
    applied = []
    values: list[np.ndarray] = []
    total = np.zeros(len(idx), dtype=np.float64)
    for plugin, weight in prof.scores:
        if not plugin.applies(cycle):
            continue
        v = plugin.normalize(cycle, plugin.score_many(cycle, idx))
        applied.append((plugin, weight))
        values.append(v)
        total += v * weight
    return applied, values, total

