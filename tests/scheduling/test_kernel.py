"""The lean select's compiled kernel decides exactly as its numpy path and as the full select:
same pools in the same order, totals and components to the bit, same rejection counts (in the
same order), on random worlds with many equal scores, capacity cuts, pools offering different
dimensions, usage below zero, members placed and assumed, weights
other than one; and it loads robustly (no cache directory, numba disabled)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.scheduling import kernel, lean
from app.scheduling.assumed import Assumed
from app.scheduling.framework import select_full
from app.scheduling.plugins import names, registry
from app.scheduling.plugins.registry import profile
from app.scheduling.results import Ranked
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import TaskSpec, compile_spec
from tests.scheduling.test_properties import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
TENANTS = ["a", "b"]


@st.composite
def kernel_worlds(draw):
    """Up to 40 pools whose scores tie often: few distinct capacities, costs and domains."""
    n = draw(st.integers(1, 40))
    pools = []
    for i in range(n):
        cap = draw(st.none() | st.tuples(*[st.sampled_from([0, 1, 2, 4])] * 3))
        cap = None if cap is None else tuple(c * 500 for c in cap)
        reserved = (0, 0, 0) if cap is None else tuple(
            draw(st.sampled_from([0, c, c // 2, -500])) for c in cap
        )
        pools.append(PoolState(
            id=f"p{i:02d}",
            tenant_ids=frozenset(draw(st.sets(st.sampled_from(TENANTS), max_size=2))),
            runtime_class="py",
            region=draw(st.sampled_from(["r1", "r2"])),
            failure_domain=draw(st.sampled_from(["f1", "f2", "f3"])),
            artifact_regions=frozenset(draw(st.sets(st.sampled_from(["r1", "r2"]), max_size=1))),
            cost_weight=draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 0.3])),
            status=draw(st.sampled_from(["ACTIVE", "ACTIVE", "ACTIVE", "CORDONED"])),
            capacity=cap,
            reserved=reserved,
        ))
    placed = []
    for j in range(draw(st.integers(0, 6))):
        p = draw(st.sampled_from(pools))
        placed.append(PlacedTask(f"x{j}", draw(st.sampled_from(TENANTS)), {}, (p.id,)))
    return pools, placed


@st.composite
def lean_specs(draw):
    body = {
        "runtimeClass": "py",
        "requests": {
            "cpuMillis": draw(st.sampled_from([0, 250, 500, 1000])),
            "memoryMiB": draw(st.sampled_from([0, 500, 1500])),
            "llmSlots": draw(st.sampled_from([0, 0, 1])),
        },
        "constraints": {
            "regions": draw(st.none() | st.just(["r1"])),
            "artifactRegion": draw(st.none() | st.sampled_from(["r1", "r2"])),
        },
    }
    if not any(body["requests"].values()):
        body["requests"]["cpuMillis"] = 250
    return compile_spec(
        TaskSpec.model_validate(body), tenant_id=draw(st.sampled_from(TENANTS)), task_id="t"
    )


def bits(ranked: Ranked) -> tuple:
    """Return everything a lean decision holds, floats as their bits."""
    return (
        ranked.pool_ids,
        [x.hex() for x in ranked.scores],
        [(n, v.hex(), r) for n, v, r in ranked.components],
        list(ranked.rejection_counts.items()),
        ranked.top_k,
    )


def assume(snapshot: Snapshot, pools, picks) -> Assumed:
    assumed = Assumed(snapshot)
    for k, (i, tenant) in enumerate(picks):
        spec = compile_spec(
            TaskSpec.model_validate({"runtimeClass": "py", "requests": {"cpuMillis": 250}}),
            tenant_id=tenant, task_id=f"as{k}",
        )
        assumed.add(spec, [(pools[i % len(pools)].id, 1)])
    return assumed


@pytest.fixture(scope="module", params=["aot", "jit"])
def compiled(request):
    """The lean select with the ahead-of-time module, then with numba's in-process compile
    (the kernel and the assumed overlay's row adder of each)."""
    kernel.load()
    if request.param == "aot":
        module = kernel._aot_module()
        fn, adder = module.lean_scores, module.row_add
    else:
        fn, adder = kernel._compile(), kernel._compile(kernel._row_add, kernel._row_add_signature)
    assert fn is not None and adder is not None
    saved, saved_add = list(kernel._KERNEL), list(kernel.ROW_ADD)
    kernel._KERNEL[:] = [fn]
    kernel.ROW_ADD[:] = [adder]
    yield fn
    kernel._KERNEL[:] = saved
    kernel.ROW_ADD[:] = saved_add


def check(pools, placed, spec, strategy, k, picks) -> None:
    snapshot = Snapshot.build(pools, placed, strategy=strategy)
    assert kernel.load() is not None
    for overlay in (None, assume(snapshot, pools, picks)):
        got = lean.decide(spec, snapshot, assumed=overlay, top_k=k)
        full = select_full(spec, snapshot, assumed=overlay, top_k=k)
        if not isinstance(got, Ranked):
            assert got == full
            continue
        c = lean.class_of(profile(strategy), spec, snapshot)
        want = lean._decide_numpy(c, spec, snapshot, overlay, k)
        assert isinstance(want, Ranked)
        assert bits(got) == bits(want)
        assert got.result() == full


@SETTINGS
@given(kernel_worlds(), lean_specs(), st.sampled_from(["spread", "binpack"]), st.integers(1, 6),
       st.lists(st.tuples(st.integers(0, 39), st.sampled_from(TENANTS)), max_size=5))
def test_the_kernel_decides_as_the_numpy_path_and_the_full_select(compiled, world, spec,
                                                                    strategy, k, picks):
    check(*world, spec, strategy, k, picks)


@SETTINGS
@given(kernel_worlds(), lean_specs(), st.sampled_from(["spread", "binpack"]), st.integers(1, 6),
       st.lists(st.tuples(st.integers(0, 39), st.sampled_from(TENANTS)), max_size=5))
def test_the_kernel_adds_weights_other_than_one_as_the_numpy_path(compiled, world, spec,
                                                                   strategy, k, picks):
    weights = {names.LEAST_LOADED: 3, names.MOST_LOADED: 3, names.COST: 2,
               names.FAILURE_DOMAIN_SPREAD: 5, names.ARTIFACT_LOCALITY: 7}
    scores = {n: (ctor, weights.get(n, w)) for n, (ctor, w) in registry.SCORES.items()}
    saved = registry.SCORES, registry._PROFILES
    registry.SCORES, registry._PROFILES = scores, {}
    try:
        check(*world, spec, strategy, k, picks)
    finally:
        registry.SCORES, registry._PROFILES = saved


def test_the_kernel_ranks_ties_by_position_as_the_stable_sort(compiled):
    # Every pool equal: the first k pools by id, each scoring the same total.
    pools = [PoolState(id=f"p{i:02d}", tenant_ids=frozenset({"a"}), runtime_class="py",
                       failure_domain="f", capacity=(1000, 1000, 0)) for i in range(30)]
    spec = compile_spec(TaskSpec.model_validate({"runtimeClass": "py",
                                                 "requests": {"cpuMillis": 10}}),
                        tenant_id="a", task_id="t")
    snapshot = Snapshot.build(pools, [])
    got = lean.decide(spec, snapshot, top_k=5)
    assert isinstance(got, Ranked)
    assert got.pool_ids == [f"p{i:02d}" for i in range(5)]
    assert len(set(got.scores)) == 1
    assert got.result() == select_full(spec, snapshot, top_k=5)


def test_threads_deciding_at_once_get_what_one_thread_gets(compiled):
    # The output buffers are reused per thread: decisions made in several threads at once
    # (the JIT kernel releases the GIL) equal the same decisions made one after another.
    import threading

    pools = [PoolState(id=f"p{i:03d}", tenant_ids=frozenset({"a", "b"}), runtime_class="py",
                       failure_domain=f"f{i % 7}", cost_weight=1.0 + (i % 5) / 10,
                       capacity=(4000 + 250 * (i % 9), 8000, 2 * (i % 3)),
                       reserved=(125 * (i % 11), 0, 0)) for i in range(120)]
    snapshot = Snapshot.build(pools, [])
    specs = [compile_spec(TaskSpec.model_validate(
        {"runtimeClass": "py", "requests": {"cpuMillis": 50 * (j % 13 + 1),
                                             "llmSlots": j % 2}}),
        tenant_id=TENANTS[j % 2], task_id=f"t{j}") for j in range(200)]
    ks = [1 + j % 5 for j in range(200)]
    want = [bits(lean.decide(s, snapshot, top_k=k)) for s, k in zip(specs, ks, strict=True)]
    got: dict[int, list] = {}
    start = threading.Barrier(4)

    def work(t: int) -> None:
        start.wait()
        got[t] = [bits(lean.decide(s, snapshot, top_k=k))
                  for _ in range(5) for s, k in zip(specs, ks, strict=True)]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(got[t] == want * 5 for t in range(4))


def test_the_kernel_compiles_uncached_when_no_cache_directory_is_available(monkeypatch):
    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    fn = kernel._compile()
    assert fn is not None and len(fn.signatures) == 1
    assert type(fn._cache).__name__ == "NullCache"


def run(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}, timeout=120,
    )
    return out.stdout.strip()


LOADED = (
    "from app.scheduling import kernel; import sys; "
    "print(kernel.load() is not None, 'numba' in sys.modules)"
)


@pytest.mark.parametrize("cache_dir", ["/proc/berth-not-writable", "/dev/null/numba"])
def test_the_kernel_loads_when_the_numba_cache_directory_is_not_writable(cache_dir):
    assert run(LOADED, NUMBA_CACHE_DIR=cache_dir, BERTH_LEAN_KERNEL="jit") == "True True"


def test_the_ahead_of_time_module_is_built_once_and_loaded_without_numba(tmp_path):
    # Built by a child process on first use; then imported: the process never loads numba.
    assert run(LOADED, BERTH_KERNEL_DIR=str(tmp_path)) == "True False"
    assert len(list(tmp_path.glob("berth_lean_*.so"))) == 1
    assert run(LOADED, BERTH_KERNEL_DIR=str(tmp_path)) == "True False"


def test_a_missing_module_is_built_in_the_background_while_numpy_decides(tmp_path):
    # A reconciler's start (lean.warm) does not wait for the build: until the module is
    # loaded the lean select decides in numpy calls (current() is None), then with it.
    code = (
        "import time; from app.scheduling import kernel, lean; lean.warm(); "
        "during = kernel.current() is None and kernel._BUILDER[0].is_alive(); "
        "kernel._BUILDER[0].join(600); "
        "import sys; print(during, kernel.current() is not None, 'numba' in sys.modules)"
    )
    assert run(code, BERTH_KERNEL_DIR=str(tmp_path)) == "True True False"
    # Once it is on disk, the next start loads it at once (no background build).
    code = (
        "from app.scheduling import kernel, lean; lean.warm(); "
        "print(kernel.loaded() is not None, bool(kernel._BUILDER))"
    )
    assert run(code, BERTH_KERNEL_DIR=str(tmp_path)) == "True False"


def test_the_kernel_compiles_in_process_when_the_module_cannot_be_built():
    assert run(LOADED, BERTH_KERNEL_DIR="/proc/berth-not-writable") == "True True"


def test_the_lean_select_keeps_its_numpy_path_without_the_kernel():
    code = (
        "from app.scheduling import kernel, lean; lean.warm(); import sys; "
        "print(kernel.loaded() is None, 'numba' in sys.modules)"
    )
    assert run(code, BERTH_LEAN_KERNEL="0") == "True False"
    assert kernel.aot_name().startswith("berth_lean_")


def test_the_kernel_input_types_match_its_one_signature():
    # A second specialization would compile in a pass: the explicit signature makes an
    # argument of another type raise instead.
    fn = kernel.load()
    assert fn is not None and len(fn.signatures) == 1
    with pytest.raises(TypeError):
        fn(np.zeros((1, 3)), *([None] * 14))


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3),
                          st.tuples(*[st.integers(1, 4000)] * 3)), max_size=12),
       st.lists(st.integers(0, 11), max_size=4))
def test_the_compiled_row_adder_assumes_the_usage_numpy_adds(compiled, adds, removed):
    # Assumed.add updates a one-pool placement's row with the compiled adder when loaded:
    # the same usage (and after removals) as numpy's ``used[i] += req * count``.
    pools = [PoolState(id=f"p{i}", tenant_ids=frozenset(TENANTS), runtime_class="py",
                       capacity=(8000, 8000, 8), reserved=(i, -i, 0)) for i in range(5)]
    snapshot = Snapshot.build(pools)
    used = {}
    for compiled_add in (True, False):
        saved = list(kernel.ROW_ADD)
        if not compiled_add:
            kernel.ROW_ADD.clear()
        try:
            assumed = Assumed(snapshot)
            for n, (pool, count, req) in enumerate(adds):
                spec = compile_spec(TaskSpec.model_validate({
                    "runtimeClass": "py",
                    "requests": {"cpuMillis": req[0], "memoryMiB": req[1], "llmSlots": req[2]},
                }), tenant_id="a")
                assumed.add(spec, [(f"p{pool}", count)], task_id=f"t{n}")
            for n in removed:
                assumed.remove(f"t{n}")
            used[compiled_add] = assumed.used.tolist()
        finally:
            kernel.ROW_ADD[:] = saved
    assert used[True] == used[False]
