"""Worked examples of ``select``: visibility, headline reasons, ties, affinity cohorts."""

from __future__ import annotations

import pytest

from app.scheduling.assumed import Assumed
from app.scheduling.explain import no_placement_document, preview_document
from app.scheduling.framework import WAKE_POOLS_MAX, select
from app.scheduling.reasons import Reason

from .factories import placed, pool, snapshot, spec


def test_places_on_least_loaded_pool_with_components_and_alternatives():
    snap = snapshot([pool("a", reserved=(2000, 0, 0)), pool("b"), pool("c", reserved=(1000, 0, 0))])
    result = select(spec(), snap)
    assert result.placement is not None
    assert result.placement.pool_id == "b"
    assert result.placement.members == (("b", 1),)
    assert [c.pool_id for c in result.candidates] == ["b", "c", "a"]
    assert [a.pool_id for a in result.placement.alternatives] == ["c", "a"]
    names = [c.name for c in result.placement.components]
    assert names == ["least_loaded", "cost", "failure_domain_spread"]
    assert sum(c.value for c in result.placement.components) == result.placement.score
    assert result.rejected == () and result.reason is None


def test_equal_scores_tie_break_by_smallest_pool_id():
    snap = snapshot([pool("pool-b"), pool("pool-c"), pool("pool-a")])
    result = select(spec(), snap)
    assert [c.pool_id for c in result.candidates] == ["pool-a", "pool-b", "pool-c"]
    assert len({c.score for c in result.candidates}) == 1


def test_top_k_bounds_candidates_on_hot_path_but_explain_lists_all():
    snap = snapshot([pool(f"p{i:02d}") for i in range(20)])
    assert len(select(spec(), snap, top_k=3).candidates) == 3
    full = select(spec(), snap, explain=True)
    assert len(full.candidates) == 20
    assert all(c.components for c in full.candidates)


def test_headline_is_the_closest_miss_and_message_keeps_every_count():
    pools = [pool(f"cpu{i}", reserved=(4000, 0, 0)) for i in range(3)]
    pools += [pool(f"node{i:03d}", runtime_class="node") for i in range(157)]
    pools += [pool("secret-pool", tenant_ids={"beta"})]
    result = select(spec(), snapshot(pools))
    assert result.placement is None
    assert result.reason.code == Reason.INSUFFICIENT_CPU
    assert result.reason.message == (
        "0/160 pools fit: 3 lack cpu (closest), 157 run another runtime class"
    )
    assert "cpu0" not in result.reason.message and "secret" not in result.reason.message
    assert no_placement_document(result.reason) == {
        "code": "insufficient_cpu",
        "message": result.reason.message,
        "rejections": {"runtime_class_mismatch": 157, "insufficient_cpu": 3},
    }
    assert result.reason.wake_pools == ("cpu0", "cpu1", "cpu2")


def _mutual_pair(snap):
    """Return the second of two tasks that each require only the other's labels (the first
    was looked at already, and is pending too)."""
    def member(me, other):
        return spec(task_id=me, labels={"app": me}, affinity={
            "required": [{"selector": {"app": other}, "topology": "pool"}]})

    assumed = Assumed(snap)
    assert select(member("a", "b"), snap, assumed=assumed).placement is None
    return select(member("b", "a"), snap, assumed=assumed)


# One case per stage boundary: the pools reach different stages, and the headline is the
# code of the latest stage reached even when an earlier stage rejected more pools.
_BOUNDARIES = {
    "visibility only: runtime class": (
        [pool("a", runtime_class="node"), pool("b", runtime_class="go")], {},
        Reason.RUNTIME_CLASS_MISMATCH,
        "0/2 pools fit: 2 run another runtime class (closest)",
    ),
    "operations beat runtime class": (
        [pool("cord", status="CORDONED")] + [pool(f"n{i}", runtime_class="node") for i in range(5)],
        {}, Reason.POOL_NOT_ACTIVE,
        "0/6 pools fit: 1 is cordoned or draining (closest), 5 run another runtime class",
    ),
    "a cordoned pool of another class is a runtime class miss": (
        [pool("cord", status="CORDONED", runtime_class="node"), pool("n", runtime_class="go")],
        {}, Reason.RUNTIME_CLASS_MISMATCH,
        "0/2 pools fit: 2 run another runtime class (closest)",
    ),
    "constraints beat operations": (
        [pool("far", region="r9")] + [pool(f"sick{i}", ready=False) for i in range(4)],
        {"constraints": {"regions": ["r1"]}}, Reason.REGION_NOT_ALLOWED,
        "0/5 pools fit: 1 is in a region not allowed (closest), 4 are not ready",
    ),
    "capacity beats constraints": (
        [pool("full", reserved=(4000, 0, 0))] + [pool(f"r{i}", region="r2") for i in range(3)],
        {"constraints": {"regions": ["r1"]}}, Reason.INSUFFICIENT_CPU,
        "0/4 pools fit: 1 lacks cpu (closest), 3 are in regions not allowed",
    ),
    "within a stage, the most pools": (
        [pool("c", reserved=(4000, 0, 0))] + [pool(f"m{i}", reserved=(0, 8192, 0))
                                              for i in range(2)],
        {"requests": {"cpuMillis": 1000, "memoryMiB": 1}}, Reason.INSUFFICIENT_MEMORY,
        "0/3 pools fit: 2 lack memory (closest), 1 lacks cpu",
    ),
    "equal counts in a stage: enum order": (
        [pool("a", status="CORDONED"), pool("b", ready=False)], {}, Reason.POOL_NOT_ACTIVE,
        "0/2 pools fit: 1 is cordoned or draining (closest), 1 is not ready",
    ),
    "anti-affinity beats capacity": (
        [pool("busy"), pool("full", reserved=(4000, 0, 0))],
        {"affinity": {"required": [{"selector": {"app": "db"}, "topology": "pool",
                                    "anti": True}]}},
        Reason.ANTI_AFFINITY_VIOLATED,
        "0/2 pools fit: 1 violates anti-affinity (closest), 1 lacks cpu",
    ),
    "gang beats everything": (
        [pool("one", capacity=(1000, 8192, 4)), pool("two", capacity=(1000, 8192, 4))]
        + [pool(f"n{i}", runtime_class="node") for i in range(8)],
        {"gang": {"members": 3}}, Reason.GANG_UNSATISFIABLE,
        "0/10 pools fit: 2 fit some members but no spread of the gang fits (closest), "
        "8 run another runtime class",
    ),
}


@pytest.mark.parametrize(("pools", "body", "code", "message"), _BOUNDARIES.values(),
                         ids=_BOUNDARIES.keys())
def test_closest_miss_on_each_stage_boundary(pools, body, code, message):
    snap = snapshot(pools, [placed("db1", "busy", app="db")])
    for explain in (False, True):
        result = select(spec(**body), snap, explain=explain)
        assert result.placement is None
        assert (result.reason.code, result.reason.message) == (code, message)


def test_mutual_affinity_pair_among_many_pools_of_other_classes_is_affinity_unsatisfied():
    pools = [pool("p0"), pool("p1")] + [pool(f"n{i:03d}", runtime_class="node")
                                        for i in range(158)]
    result = _mutual_pair(snapshot(pools))
    assert result.placement is None
    assert result.reason.code == Reason.AFFINITY_UNSATISFIED
    assert result.reason.message == (
        "0/160 pools fit: 2 do not satisfy required affinity (closest), "
        "158 run another runtime class"
    )
    assert dict(result.reason.rejections) == {
        "runtime_class_mismatch": 158, "affinity_unsatisfied": 2}


def test_wake_pools_are_left_unnamed_past_the_limit():
    many = [pool(f"p{i:02d}", reserved=(4000, 0, 0)) for i in range(WAKE_POOLS_MAX + 1)]
    assert select(spec(), snapshot(many)).reason.wake_pools is None
    few = snapshot([pool("p", reserved=(4000, 0, 0)), pool("q", status="CORDONED")])
    assert select(spec(), few).reason.wake_pools == ("p",)
    assert select(spec(runtimeClass="go"), few).reason.wake_pools == ()


def test_invisible_pools_never_appear_anywhere():
    pools = [pool("mine", status="CORDONED"), pool("theirs", tenant_ids={"beta"})]
    result = select(spec(), snapshot(pools), explain=True)
    assert [r.pool_id for r in result.rejected] == ["mine"]
    assert dict(result.rejection_counts) == {Reason.POOL_NOT_ACTIVE: 1}
    assert "theirs" not in str(preview_document(result))


def test_tenant_seeing_no_pool_gets_tenant_not_allowed_without_counts():
    result = select(spec(), snapshot([pool("theirs", tenant_ids={"beta"})]), explain=True)
    assert result.reason.code == Reason.TENANT_NOT_ALLOWED
    assert result.reason.message == "no pool is available to this tenant"
    assert result.reason.rejections == {}
    assert result.rejected == () and result.candidates == ()


def test_explain_lists_each_rejected_pool_with_its_first_reason():
    pools = [
        pool("a", runtime_class="node"),
        pool("b", region="r2"),
        pool("c", capacity=None),
        pool("d"),
    ]
    result = select(spec(constraints={"regions": ["r1"]}), snapshot(pools), explain=True)
    assert {r.pool_id: r.reasons for r in result.rejected} == {
        "a": ("runtime_class_mismatch",),
        "b": ("region_not_allowed",),
        "c": ("ledger_missing",),
    }
    assert result.placement.pool_id == "d"
    shape = preview_document(result)
    assert set(shape) == {"placement", "candidates", "rejected", "reason", "preemption"}
    assert shape["preemption"] is None
    assert set(shape["placement"]) == {"poolId", "score", "components", "members", "alternatives"}


def test_bootstrap_of_a_homogeneous_affinity_cohort_co_locates_in_one_pass():
    snap = snapshot([pool(f"p{i}") for i in range(4)])
    assumed = Assumed(snap)
    cohort = {"required": [{"selector": {"cohort": "c1"}, "topology": "pool"}]}
    chosen = []
    for i in range(3):
        s = spec(task_id=f"t{i}", labels={"cohort": "c1"}, affinity=cohort)
        result = select(s, snap, assumed=assumed)
        assert result.placement is not None
        assumed.add(s, result.placement.members)
        chosen.append(result.placement.pool_id)
    # The first seeds on the least loaded pool; the others must follow it there.
    assert chosen == ["p0", "p0", "p0"]


def test_mutually_dependent_tasks_stay_pending():
    snap = snapshot([pool("p0"), pool("p1")])
    assumed = Assumed(snap)
    a = spec(
        task_id="a",
        labels={"app": "a"},
        affinity={"required": [{"selector": {"app": "b"}, "topology": "pool"}]},
    )
    b = spec(
        task_id="b",
        labels={"app": "b"},
        affinity={"required": [{"selector": {"app": "a"}, "topology": "pool"}]},
    )
    for s in (a, b, a):
        result = select(s, snap, assumed=assumed)
        assert result.placement is None
        assert result.reason.code == Reason.AFFINITY_UNSATISFIED
        assert result.reason.rejections == {"affinity_unsatisfied": 2}


def test_preferred_affinity_never_makes_a_feasible_pool_infeasible():
    snap = snapshot([pool("p0"), pool("p1")], [placed("x", "p0", app="db")])
    for anti in (False, True):
        term = {"selector": {"app": "db"}, "topology": "pool", "weight": 100, "anti": anti}
        result = select(spec(affinity={"preferred": [term]}), snap, explain=True)
        assert {c.pool_id for c in result.candidates} == {"p0", "p1"}
        assert result.placement.pool_id == ("p1" if anti else "p0")
    # Even when no pool holds a match, every pool stays feasible.
    term = {"selector": {"app": "none"}, "topology": "pool", "weight": 100}
    assert len(select(spec(affinity={"preferred": [term]}), snap, explain=True).candidates) == 2


def test_assumed_usage_is_seen_and_remove_undoes_it():
    snap = snapshot([pool("p0", capacity=(1000, 1024, 0))])
    assumed = Assumed(snap)
    first = spec(task_id="one")
    assert select(first, snap, assumed=assumed).placement.pool_id == "p0"
    assumed.add(first, [("p0", 1)])
    second = spec(task_id="two")
    assert select(second, snap, assumed=assumed).reason.code == Reason.INSUFFICIENT_CPU
    assumed.remove("one")
    assert select(second, snap, assumed=assumed).placement.pool_id == "p0"


def test_binpack_prefers_the_fullest_pool():
    pools = [pool("a"), pool("b", reserved=(2000, 0, 0))]
    assert select(spec(), snapshot(pools)).placement.pool_id == "a"
    assert select(spec(), snapshot(pools, strategy="binpack")).placement.pool_id == "b"
