"""The lean select's per-task arithmetic in one compiled call (numba, no fastmath).

:func:`app.scheduling.lean.decide` spends most of a task in numpy's fixed per-call cost: about
twenty calls on 30–150 candidate pools. :func:`lean_scores` does what they do in one loop over
the class's pools, with the same IEEE operations in the same order (no fastmath, so no
reassociation and no contraction into fused multiply-adds):

    need = used[idx] + request                 capacity rejections, first lacking dimension
    util = clip(need / capacity, 0, 1)         0 where the pool does not offer the dimension
    dominant, mean = max(max(u0, u1), u2), ((u0 + u1) + u2) / offered dimensions
    load = clip((1.001 - dominant - mean / 1000) * 100 / 1.001, 0, 100)   (least loaded)
           clip((dominant + mean / 1000) * 100 / 1.001, 0, 100)           (most loaded)
    cost = minmax over the pools that fit (lower is better), spread = minmax of the tenant's
    members per failure domain (lower is better), artifact locality as given
    total = ((0 + v1 * w1) + v2 * w2) + ...     in profile order
    top k by total descending, then position ascending (``stages.rank``)

The compiled code is cached on disk (``cache=True``): in numba's default place (``__pycache__``
beside this file, else a user cache directory), or ``NUMBA_CACHE_DIR``; :func:`load` falls back
to an uncached compile when no cache directory is writable, and returns None when numba is not
installed (the lean select then keeps its numpy path). :func:`load` compiles or loads the
kernel and runs it once: the reconciler calls it at start so that no pass pays for it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np

__all__ = ["LOAD_LEAST", "LOAD_MOST", "SCORE_ART", "SCORE_COST", "SCORE_LOAD", "SCORE_SPREAD",
           "load", "loaded", "ready"]

#: Score codes, in the order the profile lists them (``codes`` of the kernel).
SCORE_LOAD, SCORE_COST, SCORE_SPREAD, SCORE_ART = 0, 1, 2, 3
#: The load score's kind.
LOAD_LEAST, LOAD_MOST = 0, 1
#: The slots of the kernel's integer output before the ranked positions: pools that fit,
#: capacity rejections by first lacking dimension (cpu, memory, llm slots), ranked count,
#: the head's failure-domain members.
I_FIT, I_CPU, I_MEM, I_LLM, I_K, I_MEMBERS, I_POS = 0, 1, 2, 3, 4, 5, 6
#: The slots of the float output after the ranked totals (``top_k`` of them): the head's
#: dominant and mean utilization and its score values by code.
F_DOMINANT, F_MEAN, F_VALUES = 0, 1, 2

_SCALE = 100.0 / 1.001


def _lean_scores(used, idx, req, cap, cost, fd, per_domain, spread, art, codes, weights,
                 load_kind, top_k, out_i, out_f):  # pragma: no cover - compiled (see lean)
    m = idx.shape[0]
    fit = np.empty(m, dtype=np.intp)
    dominant = np.empty(m, dtype=np.float64)
    mean = np.empty(m, dtype=np.float64)
    n_fit = 0
    n_cpu = 0
    n_mem = 0
    n_llm = 0
    r0 = req[0]
    r1 = req[1]
    r2 = req[2]
    for p in range(m):
        i = idx[p]
        n0 = used[i, 0] + r0
        n1 = used[i, 1] + r1
        n2 = used[i, 2] + r2
        c0 = cap[p, 0]
        c1 = cap[p, 1]
        c2 = cap[p, 2]
        if n0 > c0:
            n_cpu += 1
            continue
        if n1 > c1:
            n_mem += 1
            continue
        if n2 > c2:
            n_llm += 1
            continue
        dims = 0
        u0 = 0.0
        u1 = 0.0
        u2 = 0.0
        if c0 > 0:
            u0 = min(max(float(n0) / float(c0), 0.0), 1.0)
            dims += 1
        if c1 > 0:
            u1 = min(max(float(n1) / float(c1), 0.0), 1.0)
            dims += 1
        if c2 > 0:
            u2 = min(max(float(n2) / float(c2), 0.0), 1.0)
            dims += 1
        if dims < 1:
            dims = 1
        fit[n_fit] = p
        dominant[n_fit] = max(max(u0, u1), u2)
        mean[n_fit] = ((u0 + u1) + u2) / float(dims)
        n_fit += 1
    out_i[I_FIT] = n_fit
    out_i[I_CPU] = n_cpu
    out_i[I_MEM] = n_mem
    out_i[I_LLM] = n_llm
    if n_fit == 0:
        out_i[I_K] = 0
        return
    # The ranges of cost and of the tenant's members over the pools that fit.
    cost_lo = cost[fit[0]]
    cost_hi = cost_lo
    nd = per_domain.shape[0]
    mem_lo = 0
    mem_hi = 0
    if spread:
        d = fd[fit[0]]
        mem_lo = per_domain[d + nd if d < 0 else d]
        mem_hi = mem_lo
    for j in range(1, n_fit):
        p = fit[j]
        v = cost[p]
        cost_lo = min(cost_lo, v)
        cost_hi = max(cost_hi, v)
        if spread:
            d = fd[p]
            k = per_domain[d + nd if d < 0 else d]
            mem_lo = min(mem_lo, k)
            mem_hi = max(mem_hi, k)
    cost_flat = not (cost_hi > cost_lo)
    cost_factor = 0.0
    if not cost_flat:
        cost_factor = 100.0 / (cost_hi - cost_lo)
    mem_flat = not (mem_hi > mem_lo)
    mem_factor = 0.0
    if not mem_flat:
        mem_factor = 100.0 / float(mem_hi - mem_lo)
    n_scores = codes.shape[0]
    k_out = min(top_k, n_fit)
    best = out_i[I_POS:I_POS + k_out]
    tops = out_f[:k_out]
    have = 0
    for j in range(n_fit):
        p = fit[j]
        total = 0.0
        for s in range(n_scores):
            code = codes[s]
            if code == 0:
                if load_kind == 0:
                    v = ((1.001 - dominant[j]) - mean[j] / 1000.0) * _SCALE
                else:
                    v = (dominant[j] + mean[j] / 1000.0) * _SCALE
                v = min(max(v, 0.0), 100.0)
            elif code == 1:
                if cost_flat:
                    v = 100.0
                else:
                    v = min(max((cost_hi - cost[p]) * cost_factor, 0.0), 100.0)
            elif code == 2:
                if mem_flat:
                    v = 100.0
                else:
                    d = fd[p]
                    v = min(float(mem_hi - per_domain[d + nd if d < 0 else d]) * mem_factor,
                            100.0)
            else:
                v = art[p]
            total = total + v * weights[s]
        # Insert into the top k: before the first kept entry with a lower total (equal
        # totals keep the earlier position first, as a stable sort of -total does).
        if have == k_out and not (total > tops[have - 1]):
            continue
        at = have if have < k_out else k_out - 1
        while at > 0 and tops[at - 1] < total:
            if at < k_out:
                tops[at] = tops[at - 1]
                best[at] = best[at - 1]
            at -= 1
        tops[at] = total
        best[at] = j
        if have < k_out:
            have += 1
    out_i[I_K] = k_out
    # The head's components (``best`` holds positions among the fitting pools until here).
    h = best[0]
    p = fit[h]
    out_f[k_out + F_DOMINANT] = dominant[h]
    out_f[k_out + F_MEAN] = mean[h]
    members = 0
    if spread:
        d = fd[p]
        members = per_domain[d + nd if d < 0 else d]
    out_i[I_MEMBERS] = members
    for s in range(n_scores):
        code = codes[s]
        if code == 0:
            if load_kind == 0:
                v = ((1.001 - dominant[h]) - mean[h] / 1000.0) * _SCALE
            else:
                v = (dominant[h] + mean[h] / 1000.0) * _SCALE
            v = min(max(v, 0.0), 100.0)
        elif code == 1:
            if cost_flat:
                v = 100.0
            else:
                v = min(max((cost_hi - cost[p]) * cost_factor, 0.0), 100.0)
        elif code == 2:
            if mem_flat:
                v = 100.0
            else:
                v = min(float(mem_hi - members) * mem_factor, 100.0)
        else:
            v = art[p]
        out_f[k_out + F_VALUES + code] = v
    for j in range(k_out):
        best[j] = fit[best[j]]


_KERNEL: list[Callable | None] = []


def ready() -> bool:
    """Return whether :func:`load` has run."""
    return bool(_KERNEL)


def loaded() -> Callable | None:
    """Return the compiled kernel if :func:`load` has run (None: not yet, or no numba)."""
    return _KERNEL[0] if _KERNEL else None


def load() -> Callable | None:
    """Compile (or load from the cache) and run the kernel once; return it, or None when
    numba is missing or ``BERTH_LEAN_KERNEL=0`` (the numpy path then decides)."""
    if _KERNEL:
        return _KERNEL[0]
    kernel = None
    if os.environ.get("BERTH_LEAN_KERNEL", "1") != "0":
        kernel = _compile()
    _KERNEL.append(kernel)
    return kernel


def _compile() -> Callable | None:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    from numba import types as t

    # The one signature (explicit: an argument of another type raises rather than compiling
    # a second specialization in the middle of a pass). Inputs are read-only arrays, which
    # writable ones convert to.
    def ro(dtype, ndim=1):
        return t.Array(dtype, ndim, "A", readonly=True)

    out = t.Array(t.int64, 1, "A"), t.Array(t.float64, 1, "A")
    signature = t.void(
        ro(t.int64, 2), ro(t.intp), ro(t.int64), ro(t.int64, 2), ro(t.float64), ro(t.int32),
        ro(t.int64), t.boolean, ro(t.float64), ro(t.int64), ro(t.float64), t.int64, t.int64,
        *out,
    )
    try:
        kernel = numba.njit(signature, cache=True, nogil=True)(_lean_scores)
    except RuntimeError:  # pragma: no cover - no writable cache directory anywhere
        print("berth: numba cache unavailable; compiling the lean kernel uncached",
              file=sys.stderr)
        kernel = numba.njit(signature, cache=False, nogil=True)(_lean_scores)
    _warm(kernel)
    return kernel


def _warm(kernel: Callable) -> None:
    """Run ``kernel`` on a tiny input with every argument type the lean select passes."""
    used = np.zeros((2, 3), dtype=np.int64)
    idx = np.arange(2, dtype=np.intp)
    req = np.ones(3, dtype=np.int64)
    cap = np.full((2, 3), 4, dtype=np.int64)
    cost = np.array([1.0, 2.0])
    fd = np.zeros(2, dtype=np.int32)
    per_domain = np.ones(1, dtype=np.int64)
    art = np.zeros(2)
    codes = np.arange(4, dtype=np.int64)
    weights = np.ones(4)
    out_i = np.empty(I_POS + 2, dtype=np.int64)
    out_f = np.empty(2 + F_VALUES + 4)
    kernel(used, idx, req, cap, cost, fd, per_domain, True, art, codes, weights, LOAD_LEAST, 2,
           out_i, out_f)
