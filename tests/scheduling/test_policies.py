"""Policies: fifo, priority with aging, dominant-resource fairness."""

from __future__ import annotations

import pytest

from app.scheduling.policies import QueuedTask, get_policy, register

CAP = (100_000, 100_000, 100)


def task(tid, tenant="a", priority=0, seq=0, at=0.0, req=(1000, 1000, 0)):
    return QueuedTask(tid, tenant, priority, seq, at, req)


def order(name, tasks, now=0.0, usage=None, **kw):
    policy = get_policy(name, **kw)
    out = policy.order(tasks, now=now, tenant_usage=usage or {}, cluster_capacity=CAP)
    return [t.task_id for t in out]


def test_fifo_is_admission_order():
    tasks = [task("c", seq=3), task("a", seq=1), task("b", seq=2)]
    assert order("fifo", tasks) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "now,expected",
    [
        pytest.param(0.0, ["high", "low-old", "low-new"], id="fresh: priority wins"),
        pytest.param(10_000.0, ["low-old", "high", "low-new"], id="aged: old task overtakes"),
    ],
)
def test_priority_with_aging(now, expected):
    tasks = [
        task("low-old", priority=0, seq=1, at=0.0),
        task("high", priority=50, seq=2, at=now),
        task("low-new", priority=0, seq=3, at=now),
    ]
    assert order("priority", tasks, now=now, aging_seconds=60.0) == expected


def test_fair_interleaves_by_dominant_share():
    tasks = [task(f"a{i}", "a", seq=i) for i in range(3)] + [task("b0", "b", seq=10)]
    # b already uses half the cluster's memory: a goes first until it catches up.
    usage = {"b": (0, 5_000, 0)}
    assert order("fair", tasks, usage=usage) == ["a0", "a1", "a2", "b0"]
    assert order("fair", tasks) == ["a0", "b0", "a1", "a2"]


def test_fair_measures_shares_against_nominal_times_weight_with_quotas():
    tasks = [task(f"a{i}", "a", seq=i) for i in range(4)] + [
        task(f"b{i}", "b", seq=10 + i) for i in range(4)]
    # Equal usage; a is entitled to 4000m (nominal 2000 x weight 2), b to 1000m: a's share is
    # a quarter of b's, so a goes first until its share passes b's (a tie goes to a).
    usage = {"a": (1000, 0, 0), "b": (1000, 0, 0)}
    entitlements = {"a": (4000.0, 0.0, 0.0), "b": (1000.0, 0.0, 0.0)}
    assert order("fair", tasks, usage=usage, entitlements=entitlements) == [
        "a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    # Without quotas the same usage is an equal share: tenants alternate.
    assert order("fair", tasks, usage=usage)[:4] == ["a0", "b0", "a1", "b1"]


def test_fair_flooding_tenant_does_not_delay_single_task_past_first_batch():
    flood = [task(f"a{i}", "a", seq=i) for i in range(10_000)]
    single = task("b0", "b", seq=10_001)
    ordered = order("fair", [*flood, single])
    assert ordered.index("b0") < 256
    assert len(ordered) == 10_001


def test_unknown_policy_and_registration():
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")

    class Reverse:
        name = "reverse"

        def order(self, tasks, *, now, tenant_usage, cluster_capacity):
            return sorted(tasks, key=lambda t: -t.seq)

    register("reverse", Reverse)
    assert order("reverse", [task("a", seq=1), task("b", seq=2)]) == ["b", "a"]
