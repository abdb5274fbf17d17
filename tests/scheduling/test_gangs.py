"""Gang plans: order, laziness, all-or-nothing placement."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from app.scheduling import gangs
from app.scheduling.framework import select
from app.scheduling.reasons import Reason

from .factories import pool, snapshot, spec


def test_plan_iterator_is_a_generator_in_preference_order():
    it = gangs.plans(4)
    assert inspect.isgenerator(it)
    assert [(p.pools, p.per_pool) for p in it] == [(1, 4), (2, 2), (3, 2), (4, 1)]


@pytest.mark.parametrize(
    "members,min_pools,max_per_pool,expected",
    [
        pytest.param(4, 1, None, [1, 2, 3, 4], id="all"),
        pytest.param(4, 2, None, [2, 3, 4], id="min-pools"),
        pytest.param(4, 1, 2, [2, 3, 4], id="max-per-pool"),
        pytest.param(5, 1, 2, [3, 4, 5], id="ceil-respected"),
        pytest.param(1, 1, None, [1], id="single"),
    ],
)
def test_plans_respect_bounds(members, min_pools, max_per_pool, expected):
    got = gangs.plans(members, min_pools=min_pools, max_per_pool=max_per_pool)
    assert [p.pools for p in got] == expected


def test_plan_iterator_is_lazy():
    built = []
    original = gangs.Plan

    class Counting(original):
        __slots__ = ()

        def __init__(self, *a, **kw):
            built.append(a)
            super().__init__(*a, **kw)

    gangs.Plan = Counting
    try:
        it = gangs.plans(1000)
        first = next(it)
        assert first.pools == 1 and len(built) == 1
    finally:
        gangs.Plan = original


def test_candidate_iterator_yields_ranked_positions_with_room_lazily():
    plan = gangs.Plan(4, 2)
    it = gangs.plan_candidates(plan, np.array([1, 3, 2, 0, 5]))
    assert inspect.isgenerator(it)
    assert list(it) == [1, 2, 4]


GANG_POOLS = [
    pool("one", capacity=(4000, 8192, 1)),
    pool("two", capacity=(4000, 8192, 2)),
    pool("four", capacity=(4000, 8192, 4)),
]


@pytest.mark.parametrize(
    "gang,expected",
    [
        pytest.param({"members": 4}, {"four": 4}, id="one-pool-of-four"),
        pytest.param({"members": 4, "maxPerPool": 2}, {"four": 2, "two": 2}, id="two-by-two"),
        pytest.param(
            {"members": 4, "minPools": 3}, {"four": 2, "two": 1, "one": 1}, id="three-pools"
        ),
    ],
)
def test_four_member_gang_on_pools_of_one_two_and_four_slots(gang, expected):
    s = spec(requests={"llmSlots": 1}, gang=gang)
    result = select(s, snapshot(GANG_POOLS))
    assert result.placement is not None
    assert dict(result.placement.members) == expected
    assert result.placement.pool_id == result.placement.members[0][0]


@pytest.mark.parametrize(
    "gang",
    [
        pytest.param({"members": 4, "maxPerPool": 1}, id="needs-four-pools"),
        pytest.param({"members": 8}, id="more-than-all-slots"),
    ],
)
def test_gang_that_fits_no_plan_is_unsatisfiable_and_places_nothing(gang):
    s = spec(requests={"llmSlots": 1}, gang=gang)
    result = select(s, snapshot(GANG_POOLS))
    assert result.placement is None
    assert result.reason.code == Reason.GANG_UNSATISFIABLE
    assert result.reason.rejections == {"gang_unsatisfiable": 3}


def test_gang_members_are_all_or_nothing_with_assumed_usage():
    from app.scheduling.assumed import Assumed

    snap = snapshot(GANG_POOLS)
    assumed = Assumed(snap)
    first = spec(task_id="g1", requests={"llmSlots": 1}, gang={"members": 4})
    placement = select(first, snap, assumed=assumed).placement
    assumed.add(first, placement.members)
    second = spec(task_id="g2", requests={"llmSlots": 1}, gang={"members": 4})
    assert select(second, snap, assumed=assumed).reason.code == Reason.GANG_UNSATISFIABLE
    third = spec(task_id="g3", requests={"llmSlots": 1}, gang={"members": 3})
    assert dict(select(third, snap, assumed=assumed).placement.members) == {"two": 2, "one": 1}
