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


UNEVEN_POOLS = [
    pool("a-one", capacity=(1000, 8192, 4)),
    pool("b-two", capacity=(2000, 8192, 4)),
    pool("c-four", capacity=(4000, 8192, 4)),
]


def test_seven_members_use_pools_with_room_for_one_two_and_four():
    s = spec(requests={"cpuMillis": 1000}, gang={"members": 7})
    result = select(s, snapshot(UNEVEN_POOLS))
    assert result.placement is not None
    assert dict(result.placement.members) == {"a-one": 1, "b-two": 2, "c-four": 4}
    assert sum(c for _, c in result.placement.members) == 7
    assert result.placement.pool_id == result.placement.members[0][0]


@pytest.mark.parametrize(
    "slots,members,min_pools,max_per_pool,expected",
    [
        pytest.param([4, 2, 1], 7, 1, None, ((0, 4), (1, 2), (2, 1)), id="greedy-in-rank-order"),
        pytest.param([4, 2, 1], 6, 1, None, ((0, 4), (1, 2)), id="stops-when-complete"),
        pytest.param([4, 2, 1], 5, 1, 2, ((0, 2), (1, 2), (2, 1)), id="max-per-pool"),
        pytest.param([5, 0, 1], 5, 2, None, ((0, 4), (2, 1)), id="keeps-one-back-for-min-pools"),
        pytest.param([4, 2, 1], 8, 1, None, None, id="not-enough-room"),
        pytest.param([9, 0, 0], 3, 2, None, None, id="too-few-pools-with-room"),
        pytest.param([2, 2, 2], 7, 1, 2, None, id="capped-room-too-small"),
    ],
)
def test_uneven_plan(slots, members, min_pools, max_per_pool, expected):
    got = gangs.fit_uneven(
        members, np.array(slots), min_pools=min_pools, max_per_pool=max_per_pool
    )
    assert got == expected


def test_an_even_spread_is_preferred_to_the_uneven_plan():
    # 6 members: 2 pools x 3 fits on c-four and (after a-one, b-two) nothing else; even wins.
    pools = [pool("a", capacity=(3000, 8192, 4)), pool("b", capacity=(3000, 8192, 4)),
             pool("c", capacity=(5000, 8192, 4))]
    s = spec(requests={"cpuMillis": 1000}, gang={"members": 6})
    members = dict(select(s, snapshot(pools)).placement.members)
    assert sorted(members.values()) == [3, 3]


def test_uneven_gang_is_all_or_nothing_when_room_is_one_short():
    s = spec(requests={"cpuMillis": 1000}, gang={"members": 8})
    result = select(s, snapshot(UNEVEN_POOLS))
    assert result.placement is None
    assert result.reason.code == Reason.GANG_UNSATISFIABLE
