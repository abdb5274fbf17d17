"""The lean select: the reconciler's hot path for specs without affinity terms or gangs.

Most tasks (93% of the benchmark mix) name a runtime class, requests and at most regions, a
data residency, a pool selector and an artifact region. For them only capacity and the
scores that read usage change from one task to the next; everything else is a function of
the spec's **class** — audience (the tenants that see the same pools), runtime class, hard
constraints, artifact region — and of the snapshot. :func:`select_lean` therefore keeps, per
class and snapshot (a memo entry of kind
``"lean"``), the pools that pass every filter but capacity, their rejection counts, their
capacities and the class's static scores (cost and artifact locality over the whole set),
and per task does only:

    used + request > capacity      -> capacity rejections (first lacking dimension)
    (used + request) / capacity    -> least or most loaded
    tenant members per domain      -> failure-domain spread
    cost, artifact locality        -> from the class (re-normalized only when capacity cut)
    rank                           -> top_k

in one call of a compiled kernel (:mod:`app.scheduling.kernel`; about 74 K instructions per
decision against 222 K for the twenty numpy calls it replaces, which remain as the path
without the kernel and for tasks that fit nowhere). Every value is computed with the same
arithmetic, in the same order, as :func:`app.scheduling.framework.select_full`, so results are
identical (tests/scheduling/test_lean.py replays the benchmark dataset through both,
tests/scheduling/test_kernel.py compares the kernel with the numpy path on random worlds).
Score reasons are rendered for the placement's pool only, by the plugins' own ``describe``.

:func:`covers` says which calls may take this path: no required or preferred affinity, one
member, no held capacity, no explanation of every pool (``explain=True`` lists every pool with
its reason: the full path does that).
"""

from __future__ import annotations

from collections.abc import Mapping
from threading import get_ident

import numpy as np

from app.scheduling import kernel as _k
from app.scheduling.assumed import Assumed, request_row
from app.scheduling.cycle import Cycle, _tenant_domains, tenant_domain_counts
from app.scheduling.kernel import (
    F_DOMINANT,
    F_MEAN,
    F_VALUES,
    I_CPU,
    I_FIT,
    I_K,
    I_LLM,
    I_MEM,
    I_MEMBERS,
    I_POS,
    SCORE_COST,
    SCORE_LOAD,
    SCORE_SPREAD,
)
from app.scheduling.plugins import names
from app.scheduling.plugins.base import minmax
from app.scheduling.plugins.least_loaded import dominant_and_mean
from app.scheduling.plugins.registry import Profile, profile
from app.scheduling.reasons import CODE, PASS, Reason
from app.scheduling.results import Ranked, Result
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from app.scheduling.stages import (
    N_REASONS,
    counts_map,
    no_placement_result,
    rank,
    static_filters,
)

__all__ = ["capacity_rejections", "class_of", "covers", "decide", "select_lean", "warm"]

_CPU = CODE[Reason.INSUFFICIENT_CPU]
_MEMORY = CODE[Reason.INSUFFICIENT_MEMORY]
_LLM = CODE[Reason.INSUFFICIENT_LLM_SLOTS]
_NONE = np.empty(0, dtype=np.intp)
_NO_FLOATS = np.empty(0, dtype=np.float64)
_NO_MEMBERS = np.zeros(1, dtype=np.int64)
#: The kernel's code of each lean score.
_CODES = {names.LEAST_LOADED: _k.SCORE_LOAD, names.MOST_LOADED: _k.SCORE_LOAD,
          names.COST: _k.SCORE_COST, names.FAILURE_DOMAIN_SPREAD: _k.SCORE_SPREAD,
          names.ARTIFACT_LOCALITY: _k.SCORE_ART}
_FD = "failureDomain"
_HUNDREDS: dict[int, np.ndarray] = {}
#: The kernel's output buffers per top_k and thread (see decide).
_OUT: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
_KERNEL = _k._KERNEL
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
    """What the tasks of one spec class share on a snapshot: the pools past every filter but
    capacity and their rejection counts, the static scores, and (re-read when the ledger
    totals are another array) the pools' capacities."""

    __slots__ = (
        "idx", "idx_list", "ids", "counts", "counts_map", "cost", "cost_score", "art", "fd",
        "load", "scored", "cap_of", "res_of", "cap", "offered", "all_offered",
        "layout", "every_dim", "columns", "share", "unit", "reasons", "codes", "weights",
        "load_kind", "art_in", "plan", "kernel_in", "n",
    )

    def refresh(self, snapshot: Snapshot) -> None:
        """Re-read the capacities of the class's pools from ``snapshot`` (what follows from
        them only when they changed: a pass's snapshot has new arrays, mostly equal ones)."""
        if snapshot.cap.dtype != np.int64 or snapshot.reserved.dtype != np.int64:
            # What the compiled kernel reads as int64 (it does not check types).
            raise TypeError("snapshot usage arrays must be int64")
        cap = snapshot.cap.take(self.idx, axis=0)
        if self.cap_of is None or np.count_nonzero(cap != self.cap):
            self._capacities(cap)
        self.cap_of = snapshot.cap
        self.res_of = snapshot.reserved
        # Nothing reserved below zero (checked once per snapshot for every pool, then per
        # class only when some pool has it): a pool that fits has 0 <= used + request <=
        # capacity, so its utilization is within 0..1 without a clip.
        nonneg = snapshot.memoized(("nonneg",), _nonneg, snapshot.reserved) or bool(
            (snapshot.reserved.take(self.idx, axis=0) >= 0).all()
        )
        # Every pool offers every dimension: ``(used + request) / capacity`` needs neither
        # mask nor clip, and the mean divides by 3 (the same float division as by an array of
        # threes).
        self.every_dim = self.all_offered and nonneg
        self.columns = self.layout if nonneg else None

    def _capacities(self, cap: np.ndarray) -> None:
        self.cap = cap
        self.offered = cap > 0
        self.all_offered = bool(self.offered.all())
        # Every pool offers the same dimensions (a CPU-only class offers no llm slots on any
        # pool): then the utilization of a pool that fits is, column by column, ``need /
        # capacity`` for the offered dimensions and 0 for the others (see decide); the layout
        # is (dimension, capacities as floats) per offered dimension, None when pools differ.
        everywhere = self.offered.all(axis=0)
        self.layout = None
        if bool((everywhere == self.offered.any(axis=0)).all()):
            self.layout = tuple(
                (d, np.ascontiguousarray(cap[:, d], dtype=np.float64))
                for d in range(3) if everywhere[d]
            )
        #: What the mean utilization divides by: the offered dimensions (at least one).
        self.share = float(max(int(everywhere.sum()), 1))


def _nonneg(reserved: np.ndarray) -> bool:
    """Return whether no pool has anything reserved below zero."""
    return not np.count_nonzero(reserved < 0)


def class_of(prof: Profile, spec: CompiledSpec, snapshot: Snapshot) -> _Class:
    """Return the class of ``spec`` on ``snapshot``, built on first use.

    Tenants that see the same pools share classes: the filters other than tenant access read
    only the runtime class, the constraints and the pools, and tenant access passes every
    visible pool. The entry's kind ``"lean"`` carries over to the next pass's snapshot while
    health and ledger presence hold (see :meth:`Snapshot.memoized`).
    """
    key = ("lean", snapshot.audience[spec.tenant_id], spec.placement_class)
    c = snapshot.memoized(key, _class_build, prof, spec, snapshot)
    if c.cap_of is not snapshot.cap or c.res_of is not snapshot.reserved:
        c.refresh(snapshot)
    return c


def _class_build(prof: Profile, spec: CompiledSpec, snapshot: Snapshot) -> _Class:
    c = _Class()
    cycle = Cycle(spec, snapshot, None)
    idx, static_counts, _ = static_filters(prof, cycle, snapshot.visible(spec.tenant_id))
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
    c.idx_list = idx.tolist()
    c.n = len(c.idx_list)
    c.ids = [snapshot.ids[i] for i in c.idx_list]
    c.counts = counts
    c.counts_map = counts_map(counts)
    c.cost = snapshot.cost[idx]
    c.cost_score = minmax(c.cost, higher_is_better=False)
    c.fd = snapshot.fd[idx]
    c.art = None
    if spec.artifact_region is not None:
        c.art = snapshot.artifact_mask(spec.artifact_region)[idx] * 100.0
    c.scored = []
    for plugin, weight in prof.scores:
        if plugin.NAME in (names.LEAST_LOADED, names.MOST_LOADED):
            c.load = plugin
        if plugin.applies(cycle):
            if plugin.NAME not in _LEAN_SCORES:  # pragma: no cover - covers() prevents it
                raise AssertionError(f"score {plugin.NAME} applies to a lean spec")
            c.scored.append((plugin, weight))
    # Every weight 1 (the registry's): ``0 + v * 1`` is ``v`` exactly (scores are 0..100,
    # never -0.0), so the total is the plain sum of the values in profile order.
    c.unit = all(w == 1 for _, w in c.scored) and len(c.scored) > 1
    # The compiled kernel's view of the scores (see app.scheduling.kernel).
    c.codes = np.array([_CODES[p.NAME] for p, _ in c.scored], dtype=np.int64)
    c.plan = [(p, w, p.NAME, _CODES[p.NAME]) for p, w in c.scored]
    c.weights = np.array([float(w) for _, w in c.scored], dtype=np.float64)
    c.load_kind = _k.LOAD_MOST if c.load.NAME == names.MOST_LOADED else _k.LOAD_LEAST
    c.art_in = _NO_FLOATS if c.art is None else c.art
    # The ahead-of-time kernel does not check types: the class's arrays are those it names
    # (the snapshot builds them so; ``astype`` copies nothing then).
    c.kernel_in = (c.idx.astype(np.intp, copy=False), c.cost.astype(np.float64, copy=False),
                   c.fd.astype(np.int32, copy=False),
                   c.art_in.astype(np.float64, copy=False))
    #: The static score reasons rendered so far, by score name and argument.
    c.reasons = {}
    c.cap_of = None
    c.refresh(snapshot)
    return c


def _hundreds(n: int) -> np.ndarray:
    """Return a shared read-only array of ``n`` scores of 100 (``np.full(n, 100.0)``)."""
    a = _HUNDREDS.get(n)
    if a is None:
        if len(_HUNDREDS) >= 4096:
            _HUNDREDS.clear()
        a = _HUNDREDS[n] = np.full(n, 100.0)
        a.flags.writeable = False
    return a


def _spread(members: np.ndarray) -> np.ndarray:
    """Return ``minmax(members, higher_is_better=False)`` on the integer counts, without the
    float copy: ``hi - members`` is exact in int64, then scaled as the float path scales it."""
    if len(members) == 0:
        return members.astype(np.float64)
    lo = np.minimum.reduce(members)
    hi = np.maximum.reduce(members)
    if hi <= lo:
        return _hundreds(len(members))
    # hi - members >= 0 times a positive factor: never below zero, only rounding above 100.
    scaled = (hi - members) * (100.0 / float(hi - lo))
    return np.minimum(scaled, 100.0, out=scaled)


def decide(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    top_k: int = 5,
) -> Ranked | Result:
    """Decide where ``spec`` goes, for a call :func:`covers` accepts: a placement as plain
    values (:class:`Ranked`, whose :meth:`~Ranked.result` is what the full select with
    ``explain=False`` returns), or the full select's result of a task that fits nowhere."""
    tenant = spec.tenant_id
    audience = snapshot.audience.get(tenant)
    if audience is None:
        return no_placement_result(None, _NONE, snapshot)
    c = snapshot.memoized(("lean", audience, spec.placement_class), _class_first, spec, snapshot)
    if c.cap_of is not snapshot.cap or c.res_of is not snapshot.reserved:
        c.refresh(snapshot)
    if not c.n:
        return no_placement_result(c.counts, _NONE, snapshot)
    kern = _KERNEL[0] if _KERNEL else _k.current()
    if kern is None or top_k < 1:
        return _decide_numpy(c, spec, snapshot, assumed, top_k)
    # The tenant's members per failure domain, actual (``base``) and assumed (``extra``): the
    # kernel adds them (as tenant_domain_counts does); none anywhere: spread scores 100.
    extra = None if assumed is None else assumed.domain_counts(tenant, _FD)
    if extra is not None:
        spread = 2
        base = snapshot.memoized(("tdomd", tenant, _FD), _tenant_domains, snapshot, tenant, _FD)
    elif snapshot.has_placements(tenant):
        spread = 1
        base = extra = snapshot.memoized(
            ("tdomd", tenant, _FD), _tenant_domains, snapshot, tenant, _FD
        )
    else:
        spread = 0
        base = extra = _NO_MEMBERS
    # Output buffers reused per top_k and thread (the kernel overwrites what it reads back;
    # their values are copied out by tolist before the thread's next call; two threads
    # deciding at once never share one).
    key = (top_k, get_ident())
    out = _OUT.get(key)
    if out is None:
        out = _OUT[key] = (np.empty(I_POS + top_k, dtype=np.int64),
                           np.empty(top_k + F_VALUES + 4, dtype=np.float64))
    out_i, out_f = out
    idx, cost, fd, art = c.kernel_in
    kern(snapshot.reserved if assumed is None else assumed.used, idx,
         request_row(spec.requests), c.cap, cost, fd, base, extra, spread, art, c.codes,
         c.weights, c.load_kind, top_k, out_i, out_f)
    ints = out_i.tolist()
    if not ints[I_FIT]:
        # Fits nowhere (rare: the pass's unsatisfiable cache answers repeats): the numpy path
        # names the pools whose released capacity could help.
        return _decide_numpy(c, spec, snapshot, assumed, top_k)
    if ints[I_CPU] or ints[I_MEM] or ints[I_LLM]:
        counts = c.counts.copy()
        counts[_CPU] += ints[I_CPU]
        counts[_MEMORY] += ints[I_MEM]
        counts[_LLM] += ints[I_LLM]
        rejections = counts_map(counts)
    else:
        rejections = c.counts_map
    k = ints[I_K]
    floats = out_f.tolist()
    ids = c.ids
    head = ints[I_POS]
    pool = c.idx_list[head]
    values = floats[k + F_VALUES:]
    parts = []
    said = c.reasons
    for p, w, name, code in c.plan:
        value = values[code]
        if code == SCORE_LOAD:
            reason = p.reason(floats[k + F_DOMINANT], floats[k + F_MEAN])
        else:
            # Cost and artifact reasons depend on the pool only, spread's on a small count.
            key = (name, pool if code != SCORE_SPREAD else ints[I_MEMBERS])
            reason = said.get(key)
            if reason is None:
                reason = said[key] = _static_reason(p, code, key[1], value, spec, snapshot)
        parts.append((name, value * w, reason))
    if k == 1:
        chosen = [ids[head]]
        scores = floats[:1]
    else:
        chosen = [ids[p] for p in ints[I_POS:I_POS + k]]
        scores = floats[:k]
    return Ranked(chosen, scores, tuple(parts), top_k, rejections)


def _class_first(spec: CompiledSpec, snapshot: Snapshot) -> _Class:
    return _class_build(profile(snapshot.strategy), spec, snapshot)


def _static_reason(p, code: int, arg: int, value: float, spec: CompiledSpec,
                   snapshot: Snapshot) -> str:
    """Render a cost, spread or artifact reason (memoized per class by the caller)."""
    if code == SCORE_COST:
        return p.reason(snapshot.cost[arg])
    if code == SCORE_SPREAD:
        return p.reason(arg)
    return p.reason(spec.artifact_region, value)


def warm() -> None:
    """Make the compiled kernel ready now rather than in the first pass that selects: loaded
    at once when it is on disk, else built in the background (:func:`app.scheduling.kernel.start`;
    the numpy path decides until then)."""
    _k.start()


def _decide_numpy(
    c: _Class, spec: CompiledSpec, snapshot: Snapshot, assumed: Assumed | None, top_k: int
) -> Ranked | Result:
    """:func:`decide` in numpy calls (without numba, and where nothing fits)."""
    idx = c.idx
    req = request_row(spec.requests)
    # ``take`` rather than ``used[idx]``: the same rows, in a fifth of the time.
    need = (assumed.used if assumed is not None else snapshot.reserved).take(idx, axis=0)
    need += req
    lack = need > c.cap
    columns = c.columns
    if columns and not np.count_nonzero(lack):
        # Every pool fits, and they offer the same dimensions: the utilization column by
        # column (``maximum.reduce(util, axis=1)`` on rows of three is ten times slower).
        # The row sum of the full select adds left to right, its zeros (dimensions not
        # offered) changing nothing: (u0 + u1) + u2 over the offered ones.
        need = need.T
        util = [need[d] / cap for d, cap in columns]
        if len(util) == 1:
            dominant = util[0]
            mean = util[0] / c.share
        else:
            dominant = np.maximum(util[0], util[1])
            mean = util[0] + util[1]
            if len(util) == 3:
                np.maximum(dominant, util[2], out=dominant)
                mean += util[2]
            mean /= c.share
        return _ranked(c, spec, snapshot, assumed, top_k, idx, c.counts_map, dominant, mean,
                       c.cost_score, c.fd, c.art, None)
    return _select_cut(c, spec, snapshot, assumed, top_k, need, req, lack)


def capacity_rejections(lack: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return which pools lack room (``lack``: pools x dimensions, need > capacity) and a copy
    of ``counts`` with each of them counted under its first lacking dimension (cpu, memory,
    llm slots), as the capacity filter codes them."""
    bad = np.logical_or.reduce(lack, axis=1)
    counts = counts.copy()
    first_cpu = lack[:, 0]
    first_mem = lack[:, 1] & ~first_cpu
    counts[_CPU] += int(first_cpu.sum())
    counts[_MEMORY] += int(first_mem.sum())
    counts[_LLM] += int((bad & ~first_cpu & ~first_mem).sum())
    return bad, counts


def _select_cut(
    c: _Class,
    spec: CompiledSpec,
    snapshot: Snapshot,
    assumed: Assumed | None,
    top_k: int,
    need: np.ndarray,
    req: np.ndarray,
    lack: np.ndarray,
) -> Ranked | Result:
    """:func:`decide` where capacity cuts the class's pools, or its pools differ in the
    dimensions they offer (or have something reserved below zero): capacity rejections, then
    the scores of the pools that fit, with the full select's masked utilization."""
    idx = c.idx
    if np.count_nonzero(lack):
        bad, counts = capacity_rejections(lack, c.counts)
        fit = np.flatnonzero(~bad)
        if len(fit) == 0:
            # Woken by released capacity: the pools whose totals could hold the task.
            near = idx[(c.cap >= req).all(axis=1)]
            return no_placement_result(counts, near, snapshot)
        rejections = counts_map(counts)
        pools = idx[fit]
        need, cap, offered = need[fit], c.cap[fit], c.offered[fit]
        cost = minmax(c.cost[fit], higher_is_better=False)
        fd = c.fd[fit]
        art = None if c.art is None else c.art[fit]
    else:
        rejections = c.counts_map
        pools, cap, offered = idx, c.cap, c.offered
        cost, fd, art = c.cost_score, c.fd, c.art

    # least_loaded.projected_utilization, on the rows already at hand.
    if c.every_dim:
        util = need / cap
    else:
        util = np.divide(need, cap, out=np.zeros(cap.shape, dtype=np.float64), where=offered)
        np.minimum(np.maximum(util, 0.0, out=util), 1.0, out=util)
    dominant, mean = dominant_and_mean(util, offered)
    return _ranked(c, spec, snapshot, assumed, top_k, pools, rejections, dominant, mean, cost,
                   fd, art, pools)


def _ranked(
    c: _Class,
    spec: CompiledSpec,
    snapshot: Snapshot,
    assumed: Assumed | None,
    top_k: int,
    pools: np.ndarray,
    rejections: Mapping[Reason, int],
    dominant: np.ndarray,
    mean: np.ndarray,
    cost: np.ndarray,
    fd: np.ndarray,
    art: np.ndarray | None,
    cut: np.ndarray | None,
) -> Ranked:
    """Score and rank ``pools`` (the class's, or ``cut``: those capacity left), and return the
    best ``top_k`` with the placement's components."""
    load = c.load.from_utilization(dominant, mean)
    tenant = spec.tenant_id
    if (assumed is None or assumed.domain_counts(tenant, _FD) is None) and (
        not snapshot.has_placements(tenant)
    ):
        # None of the tenant's members anywhere (its first task in a pass, when the pass did
        # not read its placements): every domain counts 0, every pool scores 100.
        members = None
        spread = _hundreds(len(pools))
    else:
        per_domain = tenant_domain_counts(snapshot, assumed, tenant, _FD)[1]
        members = per_domain.take(fd)
        spread = _spread(members)
    values = {c.load.NAME: load, names.COST: cost, names.FAILURE_DOMAIN_SPREAD: spread,
              names.ARTIFACT_LOCALITY: art}
    if c.unit:
        first, second, *more = c.scored
        total = values[first[0].NAME] + values[second[0].NAME]
        for p, _ in more:
            total += values[p.NAME]
    else:
        # Weighted sum in the profile's order, from zero, exactly as the full select adds it.
        total = np.zeros(len(pools), dtype=np.float64)
        for p, w in c.scored:
            total += values[p.NAME] * w
    order = rank(pools, total, top_k)

    # The ranked positions and totals as Python values, in two conversions.
    ranked = order.tolist()
    scores = total.take(order).tolist()
    head = ranked[0]
    ids = snapshot.ids
    if cut is None:
        chosen = [c.ids[p] for p in ranked]
        pool = c.idx_list[head]
    else:
        at = cut.take(order).tolist()
        chosen = [ids[i] for i in at]
        pool = at[0]
    parts = []
    said = c.reasons
    for p, w in c.scored:
        name = p.NAME
        value = values[name].item(head)
        if name == c.load.NAME:
            reason = p.reason(dominant.item(head), mean.item(head))
        else:
            # Cost and artifact reasons depend on the pool only, spread's on a small count.
            if name != names.FAILURE_DOMAIN_SPREAD:
                arg = pool
            else:
                arg = 0 if members is None else members.item(head)
            reason = said.get((name, arg))
            if reason is None:
                if name == names.COST:
                    reason = p.reason(snapshot.cost[pool])
                elif name == names.FAILURE_DOMAIN_SPREAD:
                    reason = p.reason(arg)
                else:
                    reason = p.reason(spec.artifact_region, value)
                said[(name, arg)] = reason
        parts.append((name, value * w, reason))
    return Ranked(chosen, scores, tuple(parts), top_k, rejections)


def select_lean(
    spec: CompiledSpec,
    snapshot: Snapshot,
    *,
    assumed: Assumed | None = None,
    top_k: int = 5,
) -> Result:
    """Decide where ``spec`` goes, for a call :func:`covers` accepts (same result as the full
    select with ``explain=False``)."""
    out = decide(spec, snapshot, assumed=assumed, top_k=top_k)
    return out.result() if isinstance(out, Ranked) else out
