"""``decide`` always says why a task fits nowhere: a miss carries a reason, whatever the world
(no visible pool, every pool rejected, a gang that no plan fits, a quota refusal)."""

from __future__ import annotations

from hypothesis import given

from app.scheduling.framework import decide
from app.scheduling.results import Ranked
from app.scheduling.snapshot import Snapshot
from tests.scheduling.test_properties import GANGS, SETTINGS, specs, worlds


@SETTINGS
@given(worlds(), specs(GANGS))
def test_a_miss_always_carries_a_reason(world, s):
    pools, placed = world
    snap = Snapshot.build(pools, placed)
    for explain in (False, True):
        out = decide(s, snap, explain=explain)
        if isinstance(out, Ranked) or out.members is not None:
            continue
        assert out.reason is not None
        assert out.reason.message
