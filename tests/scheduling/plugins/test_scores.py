"""One parametrized table per score plugin: pools and a spec in, normalized values out."""

from __future__ import annotations

import numpy as np
import pytest

from app.scheduling.cycle import Cycle
from app.scheduling.plugins.artifact_locality import ArtifactLocality
from app.scheduling.plugins.cost import Cost
from app.scheduling.plugins.failure_domain_spread import FailureDomainSpread
from app.scheduling.plugins.least_loaded import LeastLoaded, MostLoaded
from app.scheduling.plugins.preferred_affinity import PreferredAffinity

from ..factories import placed, pool, snapshot, spec


def values(plugin, pools, compiled, placements=()):
    """Return the plugin's normalized values for every pool, in pool id order."""
    snap = snapshot(pools, list(placements))
    cycle = Cycle(compiled, snap, None)
    idx = np.arange(snap.n)
    out = plugin.normalize(cycle, plugin.score_many(cycle, idx))
    assert all(0.0 <= v <= 100.0 for v in out)
    return [round(float(v), 2) for v in out]


@pytest.mark.parametrize(
    "reserved,expected_order",
    [
        pytest.param([(0, 0, 0), (2000, 0, 0)], ["a", "b"], id="less-cpu-used-first"),
        pytest.param([(2000, 0, 0), (0, 0, 0)], ["b", "a"], id="order-follows-load"),
        pytest.param([(1000, 4096, 0), (1000, 0, 0)], ["b", "a"], id="dominant-then-mean"),
    ],
)
def test_least_loaded(reserved, expected_order):
    pools = [pool("a", reserved=reserved[0]), pool("b", reserved=reserved[1])]
    v = values(LeastLoaded(), pools, spec())
    ranked = sorted(zip(v, "ab", strict=True), key=lambda t: -t[0])
    assert [p for _, p in ranked] == expected_order
    packed = values(MostLoaded(), pools, spec())
    assert sorted(zip(packed, "ab", strict=True), key=lambda t: -t[0])[0][1] == expected_order[1]


@pytest.mark.parametrize(
    "reserved,expected",
    [
        pytest.param((0, 0, 0), 75.0, id="quarter-after-placing"),
        pytest.param((3000, 0, 0), 0.0, id="full-after-placing"),
    ],
)
def test_least_loaded_absolute_values(reserved, expected):
    # A 1-cpu request on 4 cpu: projected dominant 25% (or 100%), mean over 3 offered dims.
    v = values(LeastLoaded(), [pool("a", reserved=reserved)], spec())[0]
    assert v == pytest.approx(expected, abs=0.1)


@pytest.mark.parametrize(
    "costs,expected",
    [
        pytest.param([1.0, 1.0], [100.0, 100.0], id="equal"),
        pytest.param([0.5, 2.0], [100.0, 0.0], id="cheaper-wins"),
        pytest.param([0.0, 1.0, 2.0], [100.0, 50.0, 0.0], id="linear"),
    ],
)
def test_cost(costs, expected):
    pools = [pool(f"p{i}", cost_weight=c) for i, c in enumerate(costs)]
    assert values(Cost(), pools, spec()) == expected


PREF = {"selector": {"app": "db"}, "topology": "pool", "weight": 30}


@pytest.mark.parametrize(
    "terms,placed_on,expected",
    [
        pytest.param([PREF], ["a"], [100.0, 0.0], id="attract"),
        pytest.param([{**PREF, "anti": True}], ["a"], [0.0, 100.0], id="repel"),
        pytest.param([PREF], [], [0.0, 0.0], id="nothing-placed"),
        pytest.param([PREF], ["a", "b"], [100.0, 100.0], id="everywhere"),
        pytest.param(
            [PREF, {"selector": {"app": "db"}, "topology": "region", "weight": 10}],
            ["a"],
            [100.0, 0.0],
            id="normalized-over-the-feasible-range",
        ),
    ],
)
def test_preferred_affinity(terms, placed_on, expected):
    pools = [pool("a"), pool("b")]
    ps = [placed(f"x{i}", p, app="db") for i, p in enumerate(placed_on)]
    assert values(PreferredAffinity(), pools, spec(affinity={"preferred": terms}), ps) == expected


@pytest.mark.parametrize(
    "placed_on,expected",
    [
        pytest.param([], [100.0, 100.0, 100.0], id="nothing-placed"),
        pytest.param(["a"], [0.0, 0.0, 100.0], id="domain-of-a-avoided"),
        pytest.param(["a", "c", "c"], [100.0, 100.0, 0.0], id="fewest-first"),
    ],
)
def test_failure_domain_spread(placed_on, expected):
    pools = [
        pool("a", failure_domain="f1"),
        pool("b", failure_domain="f1"),
        pool("c", failure_domain="f2"),
    ]
    ps = [placed(f"x{i}", p) for i, p in enumerate(placed_on)]
    assert values(FailureDomainSpread(), pools, spec(), ps) == expected


@pytest.mark.parametrize(
    "region,artifact_regions,wanted,expected",
    [
        pytest.param("r1", set(), "r1", 100.0, id="same-region"),
        pytest.param("r2", {"r1"}, "r1", 100.0, id="artifacts-replicated"),
        pytest.param("r2", set(), "r1", 0.0, id="remote"),
    ],
)
def test_artifact_locality(region, artifact_regions, wanted, expected):
    p = pool("a", region=region, artifact_regions=frozenset(artifact_regions))
    s = spec(constraints={"artifactRegion": wanted})
    assert values(ArtifactLocality(), [p], s) == [expected]
