"""Preemption planning in the pure core: who is displaced, on which pool, and when nobody is."""

from __future__ import annotations

import numpy as np
import pytest

from app.scheduling.assumed import Assumed
from app.scheduling.framework import select
from app.scheduling.preemption import (
    Victim,
    VictimIndex,
    plan_preemption,
    victims_cheapest,
    victims_key,
)

from .factories import TENANT, pool, snapshot, spec

CPU = (1000, 0, 0)


def victim(task_id, pool_id, *, priority=0, cpu=1000, leased_at=0.0, tenant=TENANT, members=1,
           more=()):
    return Victim(task_id, tenant, priority, leased_at, (cpu, 0, 0),
                  ((pool_id, members), *more))


def full(pid, cpu=2000, **kw):
    """A pool of ``cpu`` millicores, all reserved."""
    return pool(pid, capacity=(cpu, 8192, 4), reserved=(cpu, 0, 0), **kw)


def preemptor(priority=10, **body):
    return spec(task_id="x", priority=priority, preemption="lowerPriority",
                requests={"cpuMillis": 1000}, **body)


def plan(pools, victims, s=None, **kw):
    snap = snapshot(pools)
    return plan_preemption(s or preemptor(), snap, VictimIndex(snap, victims), **kw)


def ids(victims):
    return [v.task_id for v in victims]


# --- victim choice on one pool -----------------------------------------------------------


@pytest.mark.parametrize(
    "victims,expected",
    [
        pytest.param([victim("p5", "a", priority=5), victim("p1", "a", priority=1)], ["p1"],
                     id="lowest-priority-first"),
        pytest.param([victim("small-1", "a", cpu=500), victim("small-2", "a", cpu=500),
                      victim("big", "a", cpu=1000)], ["big"], id="fewest-victims"),
        pytest.param([victim("old", "a", leased_at=1.0), victim("new", "a", leased_at=9.0)],
                     ["new"], id="most-recently-leased"),
        pytest.param([victim("p0-a", "a", priority=0, cpu=500),
                      victim("p0-b", "a", priority=0, cpu=500),
                      victim("p3", "a", priority=3, cpu=1000)], ["p0-a", "p0-b"],
                     id="two-low-before-one-higher"),
        pytest.param([victim("p1", "a", priority=1, cpu=500), victim("p0", "a", cpu=500),
                      victim("p2", "a", priority=2, cpu=1000)], ["p0", "p1"],
                     id="spares-the-higher-one-it-needs-not"),
    ],
)
def test_cheapest_set_on_a_pool(victims, expected):
    chosen = victims_cheapest(np.zeros(3, dtype=np.int64), np.array(CPU), victims, "a")
    assert sorted(ids(chosen)) == sorted(expected)


def test_a_pool_where_eviction_still_would_not_fit_is_no_candidate():
    assert victims_cheapest(np.zeros(3, dtype=np.int64), np.array((3000, 0, 0)),
                            [victim("v", "a", cpu=1000)], "a") is None
    assert plan([full("a")], [victim("v", "a", cpu=500)]) is None


def test_free_room_counts_so_one_victim_is_enough():
    chosen = victims_cheapest(np.array((600, 0, 0)), np.array(CPU),
                              [victim("old", "a", cpu=400, leased_at=1.0),
                               victim("new", "a", cpu=400, leased_at=2.0)], "a")
    assert ids(chosen) == ["new"]
    fits = victims_cheapest(np.array((1000, 0, 0)), np.array(CPU), [victim("v", "a")], "a")
    assert fits == ()


def test_set_keys_order_by_highest_priority_then_count_then_recency():
    low_many = [victim("a", "p", priority=0), victim("b", "p", priority=0)]
    high_one = [victim("c", "p", priority=1)]
    assert victims_key(low_many) < victims_key(high_one)
    assert victims_key(high_one[:1]) < victims_key([*high_one, victim("d", "p", priority=1)])
    recent = [victim("e", "p", leased_at=5.0)]
    old = [victim("f", "p", leased_at=1.0)]
    assert victims_key(recent) < victims_key(old)


# --- choosing the pool -------------------------------------------------------------------


def test_only_strictly_lower_priorities_of_the_same_tenant_are_victims():
    pools = [full("a", tenant_ids={TENANT, "other"})]
    assert plan(pools, [victim("same-priority", "a", priority=10)]) is None
    assert plan(pools, [victim("other-tenant", "a", tenant="other")]) is None
    got = plan(pools, [victim("lower", "a", priority=9)])
    assert ids(got.victims) == ["lower"] and got.members == (("a", 1),)


def test_a_task_that_never_preempts_plans_nothing():
    s = spec(task_id="x", priority=10, requests={"cpuMillis": 1000})
    assert plan([full("a")], [victim("v", "a")], s=s) is None


def test_the_pool_with_the_cheapest_set_wins_over_a_better_score():
    pools = [full("a", cost_weight=0.0), full("b", cost_weight=9.0)]
    got = plan(pools, [victim("a-p5", "a", priority=5), victim("b-p1", "b", priority=1)])
    assert got.pool_id == "b" and ids(got.victims) == ["b-p1"]


def test_equal_sets_go_to_the_higher_score_then_the_smaller_pool_id():
    cheap_b = [full("a", cost_weight=9.0), full("b", cost_weight=0.0)]
    assert plan(cheap_b, [victim("va", "a"), victim("vb", "b")]).pool_id == "b"
    same = [full("a"), full("b")]
    assert plan(same, [victim("va", "a"), victim("vb", "b")]).pool_id == "a"


def test_pools_failing_another_filter_are_never_preempted_on():
    pools = [full("a", status="CORDONED"), full("b", runtime_class="other")]
    assert plan(pools, [victim("va", "a"), victim("vb", "b")]) is None


def test_victims_taken_earlier_in_the_pass_are_not_taken_again():
    pools = [full("a")]
    assert plan(pools, [victim("v", "a")], taken={"v"}) is None


def test_holds_are_the_free_part_of_the_need():
    pools = [pool("a", capacity=(2000, 8192, 4), reserved=(1600, 0, 0))]
    got = plan(pools, [victim("v", "a", cpu=800)])
    assert ids(got.victims) == ["v"]
    assert got.holds == (("a", 1, (200, 0, 0)),)


def test_explain_lists_every_candidate_pool_cheapest_first():
    pools = [full("a"), full("b"), full("c")]
    got = plan(pools, [victim("a-p3", "a", priority=3), victim("b-p1", "b", priority=1),
                       victim("c-tiny", "c", cpu=10)], explain=True)
    assert [(c.pool_id, ids(c.victims)) for c in got.candidates] == [
        ("b", ["b-p1"]), ("a", ["a-p3"])]


def test_assumed_usage_of_the_pass_is_respected():
    snap = snapshot([pool("a", capacity=(2000, 8192, 4), reserved=(1000, 0, 0))])
    assumed = Assumed(snap)
    other = spec(task_id="o", requests={"cpuMillis": 1000})
    assumed.add(other, (("a", 1),))
    victims = VictimIndex(snap, [victim("v", "a")])
    got = plan_preemption(preemptor(), snap, victims, assumed=assumed)
    assert ids(got.victims) == ["v"] and got.holds == (("a", 1, (0, 0, 0)),)


def test_own_holds_make_a_nominated_pool_fit_for_the_preemptor_only():
    snap = snapshot([full("a")])
    assert select(preemptor(), snap).placement is None
    held = select(preemptor(), snap, holds={"a": (1000, 0, 0)})
    assert held.placement is not None and held.placement.pool_id == "a"


# --- gangs -------------------------------------------------------------------------------


def test_a_gang_preempts_for_all_members():
    pools = [full("a"), full("b")]
    s = preemptor(gang={"members": 3})
    got = plan(pools, [victim("a1", "a"), victim("a2", "a"), victim("b1", "b")], s=s)
    assert sum(c for _, c in got.members) == 3
    assert sorted(ids(got.victims)) == ["a1", "a2", "b1"]


def test_a_gang_that_eviction_cannot_seat_whole_preempts_nobody():
    pools = [full("a"), full("b")]
    s = preemptor(gang={"members": 4})
    assert plan(pools, [victim("a1", "a"), victim("a2", "a"), victim("b1", "b")], s=s) is None


def test_a_gang_victim_frees_its_members_on_every_pool():
    pools = [full("a", cpu=1000), full("b", cpu=1000)]
    s = preemptor(gang={"members": 2, "maxPerPool": 1})
    spanning = victim("g", "a", more=(("b", 1),))
    got = plan(pools, [spanning], s=s)
    assert ids(got.victims) == ["g"]
    assert dict(got.members) == {"a": 1, "b": 1}
    assert got.holds == (("a", 1, (0, 0, 0)), ("b", 1, (0, 0, 0)))
