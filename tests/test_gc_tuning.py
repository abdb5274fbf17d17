"""The serving process's garbage collector: tuned while an app runs, restored after."""

from __future__ import annotations

import gc

from app.gc_tuning import GEN0_THRESHOLD, gc_tuned


def test_the_collector_is_tuned_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with gc_tuned():
        assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > frozen  # the objects alive at start-up
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
