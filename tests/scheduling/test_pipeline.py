"""The one decision pipeline: a plugin registered in the registry works for every spec, and
the pipeline's results agree with each other whichever way they are asked for."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.scheduling import stages
from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle
from app.scheduling.framework import decide, select
from app.scheduling.plugins import registry
from app.scheduling.plugins.base import PLACEMENT_CLASS, TASK, FilterPlugin, ScorePlugin
from app.scheduling.reasons import CODE, PASS, STAGE, Reason, Stage, headline
from app.scheduling.results import Ranked
from app.scheduling.snapshot import Snapshot
from tests.scheduling.factories import placed, pool, snapshot, spec
from tests.scheduling.test_properties import GANGS, SETTINGS, specs, with_assumed, worlds

LABELS_USED = st.lists(
    st.tuples(st.sampled_from([f"p{i:02d}" for i in range(10)]), st.just({"app": "x"})),
    max_size=4,
)


class NotBlocked(FilterPlugin):
    """A filter the registry does not ship: rejects pools labelled ``blocked``."""

    NAME = "not_blocked"
    REASONS = (Reason.SELECTOR_MISMATCH,)

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        blocked = cycle.snapshot.selector_mask((("blocked", "yes"),))[idx]
        if not blocked.any():
            return None
        return np.where(blocked, np.int16(CODE[Reason.SELECTOR_MISMATCH]), np.int16(PASS))


class PreferBlue(ScorePlugin):
    """A score the registry does not ship: 100 on pools labelled ``color: blue``."""

    NAME = "prefer_blue"

    def score_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray:
        return cycle.snapshot.selector_mask((("color", "blue"),))[idx] * 100.0

    def describe(self, cycle: Cycle, pool: int, value: float) -> str:
        return "blue" if value else "not blue"


@pytest.fixture(params=[TASK, PLACEMENT_CLASS])
def new_plugins(request):
    """A profile of the shipped registry plus NotBlocked (with the given scope, before
    capacity when class-wide) and PreferBlue (weight 10): one registration line each."""
    scope = request.param
    plugin = type("ScopedNotBlocked", (NotBlocked,), {"SCOPE": scope})
    shipped = list(registry.REGISTRY)
    at = len(registry.FILTERS) if scope == TASK else [r.name for r in shipped].index("capacity")
    records = (*shipped[:at], registry.Registration(NotBlocked.NAME, plugin), *shipped[at:],
               registry.Registration(PreferBlue.NAME, PreferBlue, 10))
    return registry.profile_build("spread", records, name=f"with-blue-{scope}")


def _world() -> Snapshot:
    # p1 is the least loaded pool but blocked; p2 and p4 are blue; p3 is empty.
    return snapshot(
        [
            pool("p1", labels={"blocked": "yes", "color": "blue"}),
            pool("p2", labels={"color": "blue"}, reserved=(2000, 0, 0)),
            pool("p3", failure_domain="fd2"),
            pool("p4", labels={"color": "blue"}, reserved=(3000, 0, 0), failure_domain="fd3"),
        ],
        [placed("x1", "p3", app="db")],
    )


AFFINITY = {
    "labels": {"app": "web"},
    "affinity": {
        "required": [{"selector": {"app": "db"}, "topology": "region", "anti": False}],
        "preferred": [{"selector": {"app": "db"}, "topology": "pool", "anti": False,
                       "weight": 5}],
    },
}


@pytest.mark.parametrize(
    ("body", "members"),
    [
        pytest.param({}, (("p2", 1),), id="plain"),
        pytest.param(AFFINITY, (("p2", 1),), id="affinity"),
        pytest.param({"gang": {"members": 2, "minPools": 2}}, (("p2", 1), ("p4", 1)),
                     id="gang"),
    ],
)
def test_a_registered_filter_and_score_take_effect_for_every_spec(new_plugins, body, members):
    snap = _world()
    s = spec(**body)
    result = select(s, snap, top_k=4, profile=new_plugins)
    assert result.placement is not None
    assert result.placement.members == members
    components = {c.name: c for c in result.placement.components}
    assert components["prefer_blue"].value == 1000.0
    assert components["prefer_blue"].reason == "blue"
    assert result.rejection_counts[Reason.SELECTOR_MISMATCH] == 1  # p1, blocked
    assert "p1" not in {c.pool_id for c in result.candidates}

    # The reconciler's call decides the same, with the same components.
    out = decide(s, snap, assumed=Assumed(snap), top_k=4, profile=new_plugins)
    decided = out.result() if isinstance(out, Ranked) else out
    assert decided == result

    explained = select(s, snap, explain=True, profile=new_plugins)
    assert ("p1", ("selector_mismatch",)) in {(r.pool_id, r.reasons) for r in explained.rejected}
    got, want = explained.placement, result.placement
    assert (got.pool_id, got.score, got.components, got.members) == (
        want.pool_id, want.score, want.components, want.members
    )


def test_a_registered_filter_that_rejects_everything_is_the_headline_of_its_stage(new_plugins):
    snap = snapshot([pool("p1", labels={"blocked": "yes"})])
    result = select(spec(), snap, profile=new_plugins)
    assert result.placement is None
    assert result.reason.code == Reason.SELECTOR_MISMATCH


def _ranked_result(out):
    return out.result() if isinstance(out, Ranked) else out


@SETTINGS
@given(worlds(), specs(GANGS), LABELS_USED, st.integers(1, 6))
def test_every_way_of_asking_gives_the_same_decision(world, s, used, k):
    pools, placed_tasks = world
    snap = Snapshot.build(pools, placed_tasks)
    assumed = with_assumed(snap, pools, [u for u in used if u[0] in snap.pos])
    plain = select(s, snap, assumed=assumed, top_k=k)
    assert _ranked_result(decide(s, snap, assumed=assumed, top_k=k)) == plain
    explained = select(s, snap, assumed=assumed, explain=True, top_k=k)
    assert (explained.placement is None) == (plain.placement is None)
    assert explained.rejection_counts == plain.rejection_counts
    if plain.placement is None:
        assert explained.reason == plain.reason
        return
    got, want = explained.placement, plain.placement
    assert (got.pool_id, got.score, got.components, got.members) == (
        want.pool_id, want.score, want.components, want.members
    )
    assert [(c.pool_id, c.score) for c in got.alternatives] == [
        (c.pool_id, c.score) for c in want.alternatives
    ]
    # Ranking: total descending, then pool id; the hot path's candidates are its head.
    keys = [(-c.score, c.pool_id) for c in explained.candidates]
    if not s.is_gang:
        assert keys == sorted(keys)
        assert [c.pool_id for c in plain.candidates] == [
            c.pool_id for c in explained.candidates[: len(plain.candidates)]
        ]


@SETTINGS
@given(worlds(), st.lists(specs(GANGS), min_size=1, max_size=6))
def test_a_carried_over_class_state_decides_as_a_fresh_snapshot(world, batch):
    pools, placed_tasks = world
    first = Snapshot.build(pools, placed_tasks)
    for s in batch:  # fill the memo of the first snapshot
        select(s, first)
    usage = [tuple(int(v) + 1 for v in row) for row in first.reserved.tolist()]
    carried = first.with_usage(
        capacity=[tuple(c) for c in first.cap.tolist()],
        reserved=usage,
        fresh=first.fresh.tolist(),
        placed=placed_tasks,
    )
    for s in batch:
        again = Snapshot.build(pools, placed_tasks).with_usage(
            capacity=[tuple(c) for c in first.cap.tolist()],
            reserved=usage,
            fresh=first.fresh.tolist(),
            placed=placed_tasks,
        )
        assert select(s, carried, explain=True) == select(s, again, explain=True)


@SETTINGS
@given(worlds(), st.lists(specs(GANGS), min_size=1, max_size=8))
def test_a_pass_never_assumes_more_than_a_pool_holds(world, batch):
    pools, placed_tasks = world
    snap = Snapshot.build(pools, placed_tasks)
    assumed = Assumed(snap)
    for n, s in enumerate(batch):
        out = decide(s, snap, assumed=assumed, top_k=3)
        if out.members is not None:
            assumed.add(s, out.members, task_id=f"t{n}")
    fits = assumed.used <= snap.cap
    placed_on = assumed.usage.any(axis=1)
    assert fits[placed_on].all()


@SETTINGS
@given(worlds(), specs(GANGS))
def test_the_headline_is_the_latest_stage_any_pool_reached(world, s):
    pools, placed_tasks = world
    result = select(s, Snapshot.build(pools, placed_tasks))
    if result.placement is not None or not result.rejection_counts:
        return
    counts = result.rejection_counts
    closest = headline(counts)
    if result.reason.code == Reason.NEVER_FITS:
        # A capacity miss where no pool that got that far could hold one member even empty.
        assert STAGE[closest] == Stage.CAPACITY
        assert result.reason.wake_pools == ()
        return
    assert result.reason.code == closest
    assert STAGE[result.reason.code] == max(STAGE[r] for r in counts)


# Totals of many pools with many ties (equal pools score equal), in every size the ranking
# handles differently: sorted, picked one by one, partitioned.
TOTALS = st.integers(1, 320).flatmap(
    lambda n: st.lists(st.sampled_from([0.0, 12.5, 50.0, 99.9, 100.0, 187.25, 300.0]),
                       min_size=n, max_size=n)
    | st.lists(st.floats(0, 400, allow_nan=False), min_size=n, max_size=n)
)


@SETTINGS
@given(TOTALS, st.integers(1, 12))
def test_the_best_pools_are_the_head_of_the_ranking(totals, k):
    total = np.array(totals)
    by_definition = sorted(range(len(totals)), key=lambda p: (-totals[p], p))
    assert stages.rank(total).tolist() == by_definition
    assert stages.best(total, k) == by_definition[:k]


@pytest.mark.parametrize("n", [40, 150, 400], ids=["sorted", "picked", "partitioned"])
@pytest.mark.parametrize("k", [1, 5, 10])
def test_a_large_class_ranks_its_head_as_the_explained_ranking(n, k):
    # Pools in groups of equal load, so that many totals tie.
    pools = [pool(f"p{i:03d}", failure_domain=f"fd{i % 4}", reserved=(i % 7 * 300, 0, 0))
             for i in range(n)]
    snap = snapshot(pools, [placed("x", "p001"), placed("y", "p002")])
    s = spec(requests={"cpuMillis": 500})
    lean = decide(s, snap, top_k=k)
    assert isinstance(lean, Ranked)
    explained = select(s, snap, explain=True, top_k=k)
    assert lean.pool_ids == [c.pool_id for c in explained.candidates[:k]]
    assert lean.scores == [c.score for c in explained.candidates[:k]]
    assert lean.result() == select(s, snap, top_k=k)
