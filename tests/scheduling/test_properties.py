"""Property tests of the core's invariants over random pools and specs."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.scheduling import gangs
from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle
from app.scheduling.explain import preview_document
from app.scheduling.framework import select
from app.scheduling.plugins.registry import profile
from app.scheduling.reasons import STAGE, Reason, Stage, headline
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import TaskSpec, compile_spec

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TENANTS = ["a", "b"]
LABEL_MAPS = [{}, {"app": "x"}, {"app": "y"}, {"tier": "x"}, {"app": "x", "tier": "y"}]
LABELS = st.sampled_from(LABEL_MAPS)
SELECTORS = st.sampled_from(LABEL_MAPS[1:])


@st.composite
def pool_states(draw, i):
    cap = draw(st.none() | st.tuples(*[st.integers(0, 8)] * 3))
    cap = None if cap is None else tuple(c * 500 for c in cap)
    reserved = (0, 0, 0) if cap is None else tuple(draw(st.integers(0, c)) for c in cap)
    return PoolState(
        id=f"p{i:02d}",
        tenant_ids=frozenset(draw(st.sets(st.sampled_from(TENANTS), max_size=2))),
        runtime_class=draw(st.sampled_from(["py", "py", "node"])),
        region=draw(st.sampled_from(["r1", "r2"])),
        data_residency=draw(st.sampled_from(["eu", "us", None])),
        failure_domain=draw(st.sampled_from(["f1", "f2", "f3"])),
        labels=draw(LABELS),
        artifact_regions=frozenset(draw(st.sets(st.sampled_from(["r1", "r2"]), max_size=1))),
        cost_weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
        status=draw(st.sampled_from(["ACTIVE", "ACTIVE", "ACTIVE", "CORDONED", "DRAINING"])),
        ready=draw(st.booleans() | st.just(True)),
        heartbeat_fresh=draw(st.booleans() | st.just(True)),
        capacity=cap,
        reserved=reserved,
    )


@st.composite
def worlds(draw):
    n = draw(st.integers(1, 10))
    pools = [draw(pool_states(i)) for i in range(n)]
    placed = []
    for j in range(draw(st.integers(0, 5))):
        p = draw(st.sampled_from(pools))
        placed.append(PlacedTask(f"x{j}", draw(st.sampled_from(TENANTS)), draw(LABELS), (p.id,)))
    return pools, placed


TERM = st.fixed_dictionaries(
    {
        "selector": SELECTORS,
        "topology": st.sampled_from(["pool", "failureDomain", "region"]),
        "anti": st.booleans(),
    }
)


@st.composite
def specs(draw, gang=st.none()):
    body = {
        "runtimeClass": draw(st.sampled_from(["py", "node"])),
        "requests": {
            "cpuMillis": draw(st.sampled_from([0, 500, 1000])),
            "memoryMiB": draw(st.sampled_from([0, 500])),
            "llmSlots": draw(st.sampled_from([1, 0])),
        },
        "labels": draw(LABELS),
        "constraints": {
            "regions": draw(st.none() | st.just(["r1"])),
            "dataResidency": draw(st.none() | st.just("eu")),
            "artifactRegion": draw(st.none() | st.just("r2")),
            "poolSelector": draw(LABELS),
        },
        "affinity": {
            "required": draw(st.lists(TERM, max_size=1)),
            "preferred": [
                {**t, "weight": draw(st.integers(1, 100))} for t in draw(st.lists(TERM, max_size=2))
            ],
        },
        "gang": draw(gang),
    }
    if not any(body["requests"].values()):
        body["requests"]["cpuMillis"] = 500
    return compile_spec(
        TaskSpec.model_validate(body), tenant_id=draw(st.sampled_from(TENANTS)), task_id="t"
    )


GANGS = st.none() | st.builds(
    lambda m, k, x: {"members": m, "minPools": min(k, m), "maxPerPool": x},
    st.integers(1, 6),
    st.integers(1, 3),
    st.none() | st.integers(1, 4),
)


def with_assumed(snap: Snapshot, pools, draw_usage) -> Assumed:
    assumed = Assumed(snap)
    for k, (pid, labels) in enumerate(draw_usage):
        s = compile_spec(
            TaskSpec.model_validate(
                {"runtimeClass": "py", "requests": {"cpuMillis": 100}, "labels": labels}
            ),
            tenant_id="a",
            task_id=f"as{k}",
        )
        assumed.add(s, [(pid, 1)])
    return assumed


@SETTINGS
@given(worlds(), specs(GANGS), st.data())
def test_placement_passes_every_filter_and_fits_capacity(world, spec, data):
    pools, placed = world
    snap = Snapshot.build(pools, placed)
    extra = data.draw(
        st.lists(st.tuples(st.sampled_from([p.id for p in pools]), LABELS), max_size=3)
    )
    assumed = with_assumed(snap, pools, extra)
    result = select(spec, snap, assumed=assumed)
    if result.placement is None:
        assert result.reason is not None
        return
    cycle = Cycle(spec, snap, assumed)
    for pid, count in result.placement.members:
        i = snap.pos[pid]
        for f in profile(snap.strategy).filters:
            assert f.filter(cycle, i).ok, (f.NAME, pid)
        avail = cycle.available(np.array([i]))[0]
        assert all(count * r <= a for r, a in zip(spec.requests, avail, strict=True))
    counts = [c for _, c in result.placement.members]
    assert sum(counts) == spec.members
    assert len(counts) >= spec.min_pools
    assert len({p for p, _ in result.placement.members}) == len(counts)
    if spec.max_per_pool is not None:
        assert max(counts) <= spec.max_per_pool


@SETTINGS
@given(worlds(), specs(GANGS), st.randoms(use_true_random=False))
def test_ranking_is_identical_under_any_permutation(world, spec, rnd):
    pools, placed = world
    first = select(spec, Snapshot.build(pools, placed), explain=True)
    shuffled = list(pools)
    rnd.shuffle(shuffled)
    again = select(spec, Snapshot.build(shuffled, placed), explain=True)
    assert preview_document(first) == preview_document(again)
    hot = select(spec, Snapshot.build(shuffled, placed), top_k=3)
    if first.placement is None:
        assert hot.placement is None and hot.reason == first.reason
    else:
        assert hot.placement.members == first.placement.members
        assert hot.placement.components == first.placement.components
    if not spec.is_gang:
        assert [c.pool_id for c in hot.candidates] == [c.pool_id for c in first.candidates][:3]


@SETTINGS
@given(worlds(), specs())
def test_scores_stay_within_0_and_100(world, spec):
    pools, placed = world
    for strategy in ("spread", "binpack"):
        snap = Snapshot.build(pools, placed, strategy=strategy)
        cycle = Cycle(spec, snap, None)
        idx = np.arange(snap.n)
        for plugin, weight in profile(strategy).scores:
            assert weight > 0
            values = plugin.normalize(cycle, plugin.score_many(cycle, idx))
            assert len(values) == snap.n
            assert np.all((values >= 0) & (values <= 100)), plugin.NAME


@SETTINGS
@given(worlds(), specs())
def test_counts_cover_exactly_the_visible_pools(world, spec):
    pools, placed = world
    snap = Snapshot.build(pools, placed)
    result = select(spec, snap, explain=True)
    visible = [p for p in pools if spec.tenant_id in p.tenant_ids]
    if not visible:
        assert result.reason.code == Reason.TENANT_NOT_ALLOWED
        return
    assert sum(result.rejection_counts.values()) + len(result.candidates) == len(visible)
    assert len(result.rejected) == sum(result.rejection_counts.values())
    assert Reason.TENANT_NOT_ALLOWED not in result.rejection_counts
    if result.reason is not None:
        code = result.reason.code
        if code == Reason.NEVER_FITS:
            # The closest miss was capacity, on pools too small to ever hold a member.
            code = headline(result.rejection_counts)
            assert STAGE[code] == Stage.CAPACITY
        # The closest miss: no pool got further, and none of its stage was rejected more.
        stage = STAGE[code]
        assert all(STAGE[r] <= stage for r in result.rejection_counts)
        top = max(n for r, n in result.rejection_counts.items() if STAGE[r] == stage)
        assert result.rejection_counts[code] == top


def _some_plan_fits(slots: list[int], members: int, min_pools: int, max_per_pool):
    """Return whether any assignment of the members fits (the last, uneven plan finds one
    whenever one exists): enough pools with room, and enough room under maxPerPool."""
    cap = members if max_per_pool is None else max_per_pool
    usable = [s for s in slots if s >= 1]
    return len(usable) >= min_pools and sum(min(s, cap) for s in usable) >= members


@SETTINGS
@given(worlds(), specs(GANGS.filter(bool)))
def test_gangs_are_all_or_nothing_and_complete(world, spec):
    pools, placed = world
    snap = Snapshot.build(pools, placed)
    result = select(spec, snap, explain=True)
    feasible = [snap.pos[c.pool_id] for c in result.candidates]
    if result.placement is None:
        if result.reason.code != Reason.GANG_UNSATISFIABLE:
            assert not feasible
            return
    cycle = Cycle(spec, snap, None)
    slots = cycle.slots(np.array(feasible, dtype=np.intp)).tolist() if feasible else []
    expected = _some_plan_fits(slots, spec.members, spec.min_pools, spec.max_per_pool)
    assert (result.placement is not None) == expected


@SETTINGS
@given(st.integers(1, 40), st.integers(1, 40), st.none() | st.integers(1, 40))
def test_plans_come_in_the_stated_order(members, min_pools, max_per_pool):
    min_pools = min(min_pools, members)
    got = list(gangs.plans(members, min_pools=min_pools, max_per_pool=max_per_pool))
    want = [
        k
        for k in range(min_pools, members + 1)
        if max_per_pool is None or -(-members // k) <= max_per_pool
    ]
    assert [p.pools for p in got] == want
    assert all(a.per_pool >= b.per_pool for a, b in zip(got, got[1:], strict=False))
    for p in got:
        assert p.base * p.pools + p.extra == members
