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

How it is loaded (:func:`load`, once per process; the reconciler calls it when built, so
that no pass pays for it): by default as an extension module compiled ahead of time
(``numba.pycc``) into a user cache directory, built on first use by a child process, so that
the reconciler itself does not import numba and LLVM (about 120 MiB of resident memory per
process); else compiled by numba in the process (``cache=True``: numba's own cache places,
``NUMBA_CACHE_DIR`` first; uncached when no place is writable); without numba, or with
``BERTH_LEAN_KERNEL=0``, not at all (the lean select keeps its numpy path). The ahead-of-time
module does not check its arguments' types: :mod:`app.scheduling.lean` passes arrays of the
types the signature names, and the replay tests compare every decision with the numpy path's.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["LOAD_LEAST", "LOAD_MOST", "ROW_ADD", "SCORE_ART", "SCORE_COST", "SCORE_LOAD",
           "SCORE_SPREAD", "load", "loaded", "ready"]

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


def _lean_scores(used, idx, req, cap, cost, fd, per_domain, extra, spread, art, codes, weights,
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
    # The tenant's members per failure domain: ``per_domain`` (its actual placements) plus,
    # with spread 2, ``extra`` (its assumed ones), as numpy adds them; then the pool's domain
    # code indexes it (-1, no domain, wrapping to the last as numpy's take does).
    nd = per_domain.shape[0]
    members = np.zeros(m, dtype=np.int64)
    if spread:
        for j in range(n_fit):
            p = fit[j]
            d = fd[p]
            if d < 0:
                d += nd
            members[j] = per_domain[d] + extra[d] if spread == 2 else per_domain[d]
    mem_lo = members[0]
    mem_hi = mem_lo
    for j in range(1, n_fit):
        p = fit[j]
        v = cost[p]
        cost_lo = min(cost_lo, v)
        cost_hi = max(cost_hi, v)
        mem_lo = min(mem_lo, members[j])
        mem_hi = max(mem_hi, members[j])
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

    def value(code, j):
        """Score ``code``'s value for the ``j``-th pool that fits (numba inlines it)."""
        p = fit[j]
        if code == 0:
            if load_kind == 0:
                v = ((1.001 - dominant[j]) - mean[j] / 1000.0) * _SCALE
            else:
                v = (dominant[j] + mean[j] / 1000.0) * _SCALE
            return min(max(v, 0.0), 100.0)
        if code == 1:
            if cost_flat:
                return 100.0
            return min(max((cost_hi - cost[p]) * cost_factor, 0.0), 100.0)
        if code == 2:
            if mem_flat:
                return 100.0
            return min(float(mem_hi - members[j]) * mem_factor, 100.0)
        return art[p]

    for j in range(n_fit):
        total = 0.0
        for s in range(n_scores):
            total = total + value(codes[s], j) * weights[s]
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
    out_f[k_out + F_DOMINANT] = dominant[h]
    out_f[k_out + F_MEAN] = mean[h]
    out_i[I_MEMBERS] = members[h]
    for s in range(n_scores):
        out_f[k_out + F_VALUES + codes[s]] = value(codes[s], h)
    for j in range(k_out):
        best[j] = fit[best[j]]


def _row_add(used, i, req, count):  # pragma: no cover - compiled (see assumed)
    """Add ``count`` times ``req`` to row ``i`` of ``used`` (``used[i] += req * count``, the
    same int64 arithmetic, without numpy's per-call cost: an assumed placement's usage)."""
    used[i, 0] += req[0] * count
    used[i, 1] += req[1] * count
    used[i, 2] += req[2] * count


_KERNEL: list[Callable | None] = []
#: The compiled :func:`_row_add` of the same module, once :func:`load` found one (empty: none;
#: :class:`app.scheduling.assumed.Assumed` adds with numpy then).
ROW_ADD: list[Callable] = []
log = logging.getLogger("berth.scheduling")


def ready() -> bool:
    """Return whether :func:`load` has run."""
    return bool(_KERNEL)


def loaded() -> Callable | None:
    """Return the compiled kernel if :func:`load` has run (None: not yet, or no numba)."""
    return _KERNEL[0] if _KERNEL else None


#: Serializes :func:`load` (the reconciler's background build and a caller's load).
_LOADING = threading.Lock()
#: The background build started by :func:`start`, while it runs.
_BUILDER: list[threading.Thread] = []


def current() -> Callable | None:
    """Return the kernel for a decision now, without waiting for a build: the loaded kernel;
    None while :func:`start`'s background build runs (the numpy path decides meanwhile, with
    the same results); else what :func:`load` returns."""
    if _KERNEL:
        return _KERNEL[0]
    if _BUILDER and _BUILDER[0].is_alive():
        return None
    return load()


def start() -> None:
    """Make the kernel ready without blocking the caller for a build: load it now when that
    is quick (the ahead-of-time module is on disk, or another mode is asked for), else build
    and load it in a background thread (the build runs in a child process: about half a
    minute, once per machine and kernel source). Until it is loaded, :func:`current` returns
    None and the lean select decides in numpy calls."""
    if _KERNEL or _BUILDER:
        return
    mode = os.environ.get("BERTH_LEAN_KERNEL", "aot")
    if mode in ("0", "jit") or _aot_path(aot_dir(), aot_name()).exists():
        load()
        return
    builder = threading.Thread(target=load, name="berth-lean-kernel-build", daemon=True)
    _BUILDER.append(builder)
    builder.start()


def load() -> Callable | None:
    """Load the kernel, run it once and return it (once per process; later calls return it).

    ``BERTH_LEAN_KERNEL`` says how: ``aot`` (the default) imports the ahead-of-time compiled
    extension module from :func:`aot_dir`, building it first in a subprocess when it is not
    there (numba and a C compiler; about half a minute, once per machine and kernel source),
    so that the process itself never imports numba (about 120 MiB less resident memory);
    when that fails, or with ``jit``, numba compiles it in this process (cached on disk);
    ``0`` or no numba: None, and the lean select keeps its numpy path.
    """
    with _LOADING:
        if not _KERNEL:
            _KERNEL.append(_load())
    return _KERNEL[0]


def _load() -> Callable | None:
    mode = os.environ.get("BERTH_LEAN_KERNEL", "aot")
    kernel = adder = None
    if mode != "0":
        if mode != "jit":
            module = _aot_module()
            if module is not None:
                kernel, adder = module.lean_scores, module.row_add
        if kernel is None:
            kernel = _compile()
            adder = None if kernel is None else _compile(_row_add, _row_add_signature)
    if kernel is not None:
        _warm(kernel)
        if adder is not None:
            _warm_add(adder)
            ROW_ADD[:] = [adder]
    return kernel


def _signature():
    """Return the kernel's one signature (explicit: under the JIT an argument of another type
    raises rather than compiling a second specialization in the middle of a pass). Inputs are
    read-only arrays, which writable ones convert to."""
    from numba import types as t

    def ro(dtype, ndim=1):
        return t.Array(dtype, ndim, "A", readonly=True)

    return t.void(
        ro(t.int64, 2), ro(t.intp), ro(t.int64), ro(t.int64, 2), ro(t.float64), ro(t.int32),
        ro(t.int64), ro(t.int64), t.int64, ro(t.float64), ro(t.int64), ro(t.float64), t.int64,
        t.int64, t.Array(t.int64, 1, "A"), t.Array(t.float64, 1, "A"),
    )


def _row_add_signature():
    """Return :func:`_row_add`'s one signature."""
    from numba import types as t

    return t.void(t.Array(t.int64, 2, "A"), t.int64, t.Array(t.int64, 1, "A", readonly=True),
                  t.int64)


def _compile(fn: Callable | None = None, signature: Callable | None = None) -> Callable | None:
    """Compile ``fn`` (the kernel by default) with numba in this process."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    fn = fn or _lean_scores
    sig = (signature or _signature)()
    try:
        return numba.njit(sig, cache=True, nogil=True)(fn)
    except RuntimeError:  # pragma: no cover - no writable cache directory anywhere
        log.warning("numba cache unavailable; compiling the lean kernel uncached")
        return numba.njit(sig, cache=False, nogil=True)(fn)


# --- ahead of time ---------------------------------------------------------------------------


def aot_dir() -> Path:
    """Return where the ahead-of-time module is kept: ``BERTH_KERNEL_DIR``, else the user's
    cache directory (``$XDG_CACHE_HOME/berth`` or ``~/.cache/berth``)."""
    given = os.environ.get("BERTH_KERNEL_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "berth"


def aot_name() -> str:
    """Return the module name of this kernel source for this Python, numpy and numba: a
    changed kernel (or toolchain) is another module, never a stale one."""
    try:
        numba_version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        numba_version = "none"
    key = "\0".join((
        inspect.getsource(_lean_scores), inspect.getsource(_row_add), _SIGNATURE_TEXT,
        numba_version, np.__version__, sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "",
    ))
    return "berth_lean_" + hashlib.sha256(key.encode()).hexdigest()[:16]


#: What :func:`_signature` and :func:`_row_add_signature` say, as text (part of
#: :func:`aot_name`'s key).
_SIGNATURE_TEXT = "v2: row_add: used i8[:,:], i i8, req i8[:], count i8; lean_scores: " \
    "used i8[:,:], idx intp[:], req i8[:], cap i8[:,:], cost f8[:], fd i4[:], " \
    "per_domain i8[:], extra i8[:], spread i8, art f8[:], codes i8[:], weights f8[:], " \
    "load_kind i8, top_k i8, out_i i8[:], out_f f8[:]"


def _aot_path(directory: Path, name: str) -> Path:
    return directory / (name + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def _aot_module():
    """Import the ahead-of-time module, building it first when missing; None on failure."""
    try:
        directory, name = aot_dir(), aot_name()
        path = _aot_path(directory, name)
        if not path.exists():
            directory.mkdir(parents=True, exist_ok=True)
            with open(directory / (name + ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait for it
                if not path.exists():
                    _aot_build_subprocess(directory)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as exc:  # any failure: the in-process compile decides
        log.warning("lean kernel: no ahead-of-time module (%s); compiling in process", exc)
        return None


def _aot_build_subprocess(directory: Path) -> None:
    """Build the module in a child process (this one never imports numba)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [sys.executable, "-m", "app.scheduling.kernel", str(directory)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"build failed: {out.stderr.strip()[-500:]}")


def aot_build(directory: Path) -> Path:
    """Compile the kernel ahead of time into ``directory`` (numba.pycc, generic CPU: the
    module may be shared by machines); return the module's path."""
    from numba.pycc import CC

    name = aot_name()
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        cc.verbose = False
        cc.export("lean_scores", _signature())(_lean_scores)
        cc.export("row_add", _row_add_signature())(_row_add)
        cc.compile()
        built = _aot_path(Path(tmp), name)
        path = _aot_path(directory, name)
        os.replace(built, path)
    return path


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
    kernel(used, idx, req, cap, cost, fd, per_domain, per_domain, 2, art, codes, weights,
           LOAD_LEAST, 2, out_i, out_f)


def _warm_add(adder: Callable) -> None:
    """Run the row adder once on a tiny input of the types it is given."""
    used = np.zeros((1, 3), dtype=np.int64)
    adder(used, 0, np.ones(3, dtype=np.int64), 2)
    if used.tolist() != [[2, 2, 2]]:  # pragma: no cover - a broken build
        raise RuntimeError("the compiled row adder adds wrongly")


if __name__ == "__main__":
    print(aot_build(Path(sys.argv[1]) if len(sys.argv) > 1 else aot_dir()))
