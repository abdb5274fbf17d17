"""The load scorers' descriptions read back the utilization scoring computed, and say the
same as computing it afresh for the one pool."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle
from app.scheduling.framework import select
from app.scheduling.plugins import names
from app.scheduling.plugins.least_loaded import LeastLoaded, MostLoaded
from app.scheduling.snapshot import Snapshot
from tests.scheduling.factories import pool, spec
from tests.scheduling.test_properties import SETTINGS, specs, worlds


@SETTINGS
@given(worlds(), specs())
def test_descriptions_match_a_fresh_computation(world, s):
    pools, placed = world
    for strategy, plugin, name in (
        ("spread", LeastLoaded(), names.LEAST_LOADED),
        ("binpack", MostLoaded(), names.MOST_LOADED),
    ):
        snap = Snapshot.build(pools, placed, strategy=strategy)
        assumed = Assumed(snap)
        first = select(spec(tenant=s.tenant_id, task_id="a", requests={"cpuMillis": 500}), snap,
                       assumed=assumed)
        if first.placement is not None:
            assumed.add(spec(tenant=s.tenant_id, task_id="a", requests={"cpuMillis": 500}),
                        first.placement.members)
        result = select(s, snap, assumed=assumed, explain=True)
        for c in result.candidates:
            (comp,) = [x for x in c.components if x.name == name]
            fresh = Cycle(s, snap, assumed)  # no notes: computed for the one pool
            assert comp.reason == plugin.describe(fresh, snap.pos[c.pool_id], comp.value)


def test_descriptions_of_a_loaded_world_match_a_fresh_computation():
    pools = [
        pool(f"p{i}", capacity=(4000, 8192, 4), reserved=(i * 300, i * 900, i % 3))
        for i in range(6)
    ]
    s = spec(requests={"cpuMillis": 700, "memoryMiB": 100, "llmSlots": 1})
    for strategy, plugin in (("spread", LeastLoaded()), ("binpack", MostLoaded())):
        snap = Snapshot.build(pools, strategy=strategy)
        result = select(s, snap, explain=True)
        assert len(result.candidates) == 6
        reasons = set()
        for c in result.candidates:
            (comp,) = [x for x in c.components if x.name == plugin.NAME]
            assert comp.reason == plugin.describe(Cycle(s, snap, None), snap.pos[c.pool_id], 0.0)
            reasons.add(comp.reason)
        assert len(reasons) == 6


_EDGES = [0.0, -0.0, 1.0, 0.005, 0.015, 0.025, 0.125, 0.135, 0.145, 0.985, 0.995, 1e-300,
          5e-324, 0.004999999999999999, -0.001, 1.001, float("nan"), float("inf")]


_UTILIZATIONS = (st.floats(-0.01, 1.01) | st.sampled_from(_EDGES)
                 | st.fractions(0, 1, max_denominator=2000).map(float))


@SETTINGS
@given(_UTILIZATIONS, _UTILIZATIONS)
def test_memoized_reasons_are_the_formatted_percents(dominant, mean):
    # The reasons are memoized by whole percents: the same text as formatting the floats,
    # ties to even (0.125 -> 12%, 0.135 -> 14%) and -0.0 ("-0%") included.
    for plugin, tail in ((LeastLoaded(), "lower is better"), (MostLoaded(), "higher packs")):
        for _ in range(2):  # rendered, then memoized
            assert plugin.reason(dominant, mean) == (
                f"projected utilization {dominant:.0%} dominant, {mean:.0%} mean; {tail}"
            )
