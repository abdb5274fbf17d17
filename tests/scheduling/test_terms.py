"""The terms select (single-member specs with affinity terms) decides exactly as the full
select: same pool, score, components, alternatives, candidates, rejection counts and pending
reasons, and the same stored placement document, on every task.

The benchmark's ``antiaffinity`` mix (10% required anti-affinity on top of the default mix's
preferred affinity) is replayed with both selects on the same overlay, roomy and with a
quarter of its capacity, under spread and binpack; random worlds (hypothesis) add positive
required terms (and their bootstrap), every topology, actual placements and assumed overlays.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.bench.dataset import dataset_generate
from app.bench.replay import replay
from app.scheduling import lean, terms
from app.scheduling.cycle import Cycle
from app.scheduling.framework import select, select_full, select_ranked
from app.scheduling.results import Ranked
from app.scheduling.snapshot import PoolState, Snapshot
from app.scheduling.spec import TaskSpec, compile_spec
from tests.scheduling.test_lean import Both, reconciler_differs
from tests.scheduling.test_properties import LABELS, SETTINGS, specs, with_assumed, worlds


class Terms(Both):
    """:class:`Both`, counting the calls the terms select decides."""

    def __init__(self) -> None:
        super().__init__()
        self.terms = 0
        self.anti_rejected = 0

    def __call__(self, spec, snapshot, *, assumed, top_k):
        covered = not lean.covers(spec) and terms.covers(spec)
        self.terms += covered
        old = super().__call__(spec, snapshot, assumed=assumed, top_k=top_k)
        self.anti_rejected += covered and "anti_affinity_violated" in old.rejection_counts
        return old


@pytest.fixture(scope="module")
def anti():
    return dataset_generate(pools=1000, tasks=5000, seed=3, mix="antiaffinity")


@pytest.mark.parametrize(
    ("scale", "strategy"),
    [(1.0, "spread"), (0.25, "spread"), (0.25, "binpack")],
    ids=["antiaffinity", "quarter-capacity", "quarter-capacity-binpack"],
)
def test_the_terms_select_decides_the_antiaffinity_mix_as_the_full_one(anti, scale, strategy):
    both = Terms()
    steps = list(replay(anti, both, batch=1024, top_k=4, capacity_scale=scale,
                        strategy=strategy))
    assert both.differences == []
    assert len(steps) == 5000
    # 10% required anti-affinity and 5% preferred affinity of the calls (not the cached).
    assert both.terms > 0.12 * both.calls
    # Anti-affinity rejects pools on the terms path (not only capacity does).
    assert both.anti_rejected > 0.02 * both.calls
    if scale < 1:
        assert both.capacity_rejections > 0 and both.pending > 0
    else:
        assert both.pending == 0


@SETTINGS
@given(worlds(), specs(), st.lists(st.tuples(st.integers(0, 9), LABELS), max_size=4),
       st.sampled_from(["spread", "binpack"]), st.integers(1, 5))
def test_the_terms_select_decides_random_worlds_as_the_full_one(world, spec, usage, strategy, k):
    pools, placed = world
    snapshot = Snapshot.build(pools, placed, strategy=strategy)
    ids = [p.id for p in pools]
    assumed = with_assumed(snapshot, pools, [(ids[i % len(ids)], lb) for i, lb in usage])
    for overlay in (None, assumed):
        old = select_full(spec, snapshot, assumed=overlay, top_k=k)
        assert select(spec, snapshot, assumed=overlay, top_k=k) == old
        assert not reconciler_differs(spec, snapshot, old, assumed=overlay, top_k=k)
        if not lean.covers(spec):
            # The terms path decides it (a placement comes as plain values, like a lean one).
            out = terms.decide(spec, snapshot, assumed=overlay, top_k=k)
            assert (out.result() if isinstance(out, Ranked) else out) == old


@SETTINGS
@given(worlds(), specs(), st.lists(st.tuples(st.integers(0, 9), LABELS), max_size=4))
def test_term_counts_at_some_pools_are_the_per_pool_counts_there(world, spec, usage):
    pools, placed = world
    snapshot = Snapshot.build(pools, placed)
    ids = [p.id for p in pools]
    assumed = with_assumed(snapshot, pools, [(ids[i % len(ids)], lb) for i, lb in usage])
    idx = np.arange(0, snapshot.n, 2, dtype=np.intp)
    for overlay in (None, assumed):
        for term in (*spec.required, *spec.preferred):
            counts, total = Cycle(spec, snapshot, overlay).term_counts(term)
            at, total_at = Cycle(spec, snapshot, overlay).term_counts_at(term, idx)
            assert at.tolist() == counts[idx].tolist() and total_at == total
            # Summed per pool from the placements themselves.
            want = np.zeros(snapshot.n, dtype=np.int64)
            for p in placed:
                if p.tenant_id == spec.tenant_id and term.selector <= frozenset(p.labels.items()):
                    for pool in p.pool_ids:
                        want[snapshot.pos[pool]] += 1
            extra = overlay.placed_counts(spec.tenant_id, term.selector) if overlay else None
            if extra is not None:
                want += extra
            assert total == int(want.sum())
            dom, nd = snapshot.domains(term.topology)
            per_domain = np.bincount(dom, weights=want, minlength=nd).astype(np.int64)
            assert counts.tolist() == per_domain[dom].tolist()


def test_single_member_specs_with_terms_take_the_terms_path():
    def spec(**body):
        data = {"runtimeClass": "py", "requests": {"cpuMillis": 1}, **body}
        return compile_spec(TaskSpec.model_validate(data), tenant_id="a", task_id="t")

    anti = spec(affinity={"required": [{"selector": {"a": "b"}, "anti": True}]})
    preferred = spec(affinity={"preferred": [{"selector": {"a": "b"}, "weight": 1}]})
    for s in (anti, preferred):
        assert not lean.covers(s) and terms.covers(s)
        assert not terms.covers(s, explain=True)
        assert not terms.covers(s, {"p1": (1, 0, 0)})
    assert not terms.covers(spec(gang={"members": 2},
                                 affinity={"preferred": [{"selector": {"a": "b"}, "weight": 1}]}))
    # The reconciler's select gives a placement with terms as plain values, as a lean one.
    pool = PoolState(id="p1", tenant_ids=frozenset({"a"}), runtime_class="py", region="r1",
                     failure_domain="f1", capacity=(1000, 1000, 0))
    snapshot = Snapshot.build([pool], [])
    for s in (anti, preferred):
        ranked = select_ranked(s, snapshot)
        assert isinstance(ranked, Ranked) and ranked.members == (("p1", 1),)
        assert ranked.result() == select_full(s, snapshot)
