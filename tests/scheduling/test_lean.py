"""The lean select decides exactly as the full select: same pool, score, components,
alternatives, candidates, rejection counts and pending reasons, on every task, and the
reconciler's placement document built from its plain values (``Ranked``) is the full
result's, byte for byte.

The benchmark dataset is replayed in passes (``app.bench.replay``) with both selects on the
same overlay, as roomy as the benchmark makes it, with a fraction of its capacity (capacity
rejections, tasks that fit nowhere) and under binpack; random worlds (hypothesis) add
unhealthy, cordoned and ledger-less pools, pools offering no llm slots, actual placements and
assumed overlays.
"""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.bench import core
from app.bench.dataset import dataset_generate
from app.bench.replay import replay
from app.scheduling.assumed import Assumed
from app.scheduling.explain import placement_document, placement_stored, ranked_stored
from app.scheduling.framework import select, select_full, select_ranked
from app.scheduling.lean import _spread, covers
from app.scheduling.plugins import names, registry
from app.scheduling.plugins.base import minmax
from app.scheduling.plugins.least_loaded import dominant_and_mean
from app.scheduling.results import Ranked
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import TaskSpec, compile_spec
from tests.scheduling.test_properties import GANGS, LABELS, SETTINGS, specs, with_assumed, worlds


def stored(result) -> bytes | None:
    """Return the stored placement JSON of a result (None: no placement)."""
    if isinstance(result, Ranked):
        # As the reconciler stores it and the API reads it back.
        return orjson.dumps(placement_document(ranked_stored(result)))
    p = result.placement
    if p is None:
        return None
    return orjson.dumps(placement_document(
        placement_stored(p, members=p.members, alternatives=p.alternatives)
    ))


def reconciler_differs(spec, snapshot, old, *, assumed, top_k) -> bool:
    """Return whether the reconciler's select (``select_ranked``) differs from ``old`` (the
    full select's result): in its result, its members or its stored placement JSON."""
    ranked = select_ranked(spec, snapshot, assumed=assumed, top_k=top_k)
    result = ranked.result() if isinstance(ranked, Ranked) else ranked
    return (
        result != old
        or ranked.members != old.members
        or ranked.rejection_counts != old.rejection_counts
        or stored(ranked) != stored(old)
    )


class Both:
    """A select that runs the dispatching and the full select and records every difference."""

    def __init__(self) -> None:
        self.lean = 0
        self.calls = 0
        self.placed = 0
        self.pending = 0
        self.capacity_rejections = 0
        self.differences: list[tuple] = []

    def __call__(self, spec, snapshot, *, assumed, top_k):
        new = select(spec, snapshot, assumed=assumed, top_k=top_k)
        old = select_full(spec, snapshot, assumed=assumed, top_k=top_k)
        self.calls += 1
        self.lean += covers(spec)
        self.placed += old.placement is not None
        self.pending += old.placement is None
        self.capacity_rejections += sum(
            n for r, n in old.rejection_counts.items() if r.startswith("insufficient_")
        )
        differs = new != old or reconciler_differs(
            spec, snapshot, old, assumed=assumed, top_k=top_k
        )
        if differs and len(self.differences) < 5:
            self.differences.append((spec, old, new))
        return old


@pytest.fixture(scope="module")
def dataset():
    return dataset_generate(pools=1000, tasks=5000, seed=3)


@pytest.mark.parametrize(
    ("scale", "strategy"),
    [(1.0, "spread"), (0.25, "spread"), (0.25, "binpack")],
    ids=["bench-dataset", "quarter-capacity", "quarter-capacity-binpack"],
)
def test_the_lean_select_decides_the_benchmark_dataset_as_the_full_one(dataset, scale, strategy):
    both = Both()
    steps = list(replay(dataset, both, batch=1024, top_k=4, capacity_scale=scale,
                        strategy=strategy))
    assert both.differences == []
    assert len(steps) == 5000 and both.calls > 4000
    assert both.lean > 0.9 * both.calls  # 93% of the mix: no affinity, no gang
    if scale < 1:
        # The replay reached what makes the lean path branch: capacity cuts and no room.
        assert both.capacity_rejections > 0 and both.pending > 0
    else:
        assert both.pending == 0


def test_the_lean_select_decides_the_core_benchmark_mix_as_the_full_one():
    core_mix_both(random.Random(5))


@pytest.mark.parametrize("strategy", ["spread", "binpack"])
def test_the_lean_select_decides_as_the_full_one_with_weights_other_than_one(
    monkeypatch, strategy
):
    # With every weight 1 the lean total is a plain sum; other weights take the weighted sum.
    weights = {names.LEAST_LOADED: 3, names.MOST_LOADED: 3, names.COST: 2,
               names.FAILURE_DOMAIN_SPREAD: 5, names.ARTIFACT_LOCALITY: 7}
    scores = {n: (ctor, weights.get(n, w)) for n, (ctor, w) in registry.SCORES.items()}
    monkeypatch.setattr(registry, "SCORES", scores)
    monkeypatch.setattr(registry, "_PROFILES", {})
    assert all(w != 1 for _, w in registry.profile(strategy).scores)
    core_mix_both(random.Random(9), strategy=strategy)


@SETTINGS
@given(st.lists(st.integers(0, 40), max_size=60))
def test_the_integer_spread_is_the_float_min_max_to_the_bit(counts):
    members = np.array(counts, dtype=np.int64)
    got = _spread(members)
    want = minmax(members.astype(np.float64), higher_is_better=False)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3),
                          st.integers(1, 1000), st.integers(-5, 1500)), max_size=40))
def test_dominant_and_mean_by_columns_are_the_row_reductions_to_the_bit(rows):
    cap = np.array([(a * r, b * r, c * r) for a, b, c, r, _ in rows], dtype=np.int64)
    used = np.array([(u, u // 2, u % 7) for *_, u in rows], dtype=np.int64)
    cap, used = cap.reshape(-1, 3), used.reshape(-1, 3)
    offered = cap > 0
    util = np.divide(used, cap, out=np.zeros(cap.shape), where=offered)
    np.minimum(np.maximum(util, 0.0, out=util), 1.0, out=util)
    dominant, mean = dominant_and_mean(util, offered)
    assert dominant.tobytes() == util.max(axis=1).tobytes()
    want = util.sum(axis=1) / np.maximum(offered.sum(axis=1), 1)
    assert mean.dtype == want.dtype and mean.tobytes() == want.tobytes()


def core_mix_both(rng: random.Random, *, strategy: str = "spread") -> None:
    """Decide 1,500 tasks of the core benchmark's mix on 300 pools with both selects."""
    pools = core.make_pools(300, rng)
    snapshot = Snapshot.build(pools, core.make_placed(pools, rng, 150), strategy=strategy)
    both = Both()
    assumed = Assumed(snapshot)
    for i in range(1500):
        spec = compile_spec(TaskSpec.model_validate(core.make_spec(i, rng)),
                            tenant_id=rng.choice(core.TENANTS), task_id=f"t{i}")
        result = both(spec, snapshot, assumed=assumed, top_k=4)
        if result.placement is not None:
            assumed.add(spec, result.placement.members)
    assert both.differences == []
    assert both.lean > 0 and both.pending > 0 and both.capacity_rejections > 0


@SETTINGS
@given(worlds(), specs(GANGS), st.lists(st.tuples(st.integers(0, 9), LABELS), max_size=4),
       st.sampled_from(["spread", "binpack"]), st.integers(1, 5))
def test_the_lean_select_decides_random_worlds_as_the_full_one(world, spec, usage, strategy, k):
    pools, placed = world
    snapshot = Snapshot.build(pools, placed, strategy=strategy)
    ids = [p.id for p in pools]
    assumed = with_assumed(snapshot, pools, [(ids[i % len(ids)], lb) for i, lb in usage])
    for overlay in (None, assumed):
        new = select(spec, snapshot, assumed=overlay, top_k=k)
        old = select_full(spec, snapshot, assumed=overlay, top_k=k)
        assert new == old
        assert not reconciler_differs(spec, snapshot, old, assumed=overlay, top_k=k)


def test_only_specs_without_affinity_gangs_holds_or_explanations_take_the_lean_path():
    def spec(**body):
        data = {"runtimeClass": "py", "requests": {"cpuMillis": 1}, **body}
        return compile_spec(TaskSpec.model_validate(data), tenant_id="a", task_id="t")

    plain = spec(constraints={"regions": ["r1"], "artifactRegion": "r1"}, labels={"a": "b"})
    assert covers(plain)
    assert not covers(plain, explain=True)
    assert not covers(plain, {"p1": (1, 0, 0)})
    assert not covers(spec(gang={"members": 2}))
    assert covers(spec(gang={"members": 1}))
    assert not covers(spec(affinity={"required": [{"selector": {"a": "b"}}]}))
    assert not covers(
        spec(affinity={"preferred": [{"selector": {"a": "b"}, "weight": 1}]})
    )
