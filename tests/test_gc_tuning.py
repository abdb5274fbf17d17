"""The serving process's garbage collector: tuned while an app runs, restored after."""

from __future__ import annotations

import gc

from app.gc_tuning import GEN0_THRESHOLD, gc_paused, gc_tuned


def test_the_collector_is_tuned_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with gc_tuned():
        assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > frozen  # the objects alive at start-up
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_overlapping_pauses_turn_the_collector_on_after_the_last() -> None:
    assert gc.isenabled()
    first, second = gc_paused(), gc_paused()
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second block still runs
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_pause_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_a_reconciler_pass_runs_with_the_collector_off(monkeypatch) -> None:
    from app.reconciler import passes

    seen: list[bool] = []

    async def attempt(operation, what):
        seen.append(gc.isenabled())
        return passes.PassResult(pass_id="p")

    ctx = passes.PassContext(db=None, config=None, slots=frozenset(), rng=lambda: 0.0,
                             sleep=None)
    monkeypatch.setattr(passes.PassContext, "retry", lambda self, op, what: attempt(op, what))
    await passes.pass_run(ctx, pass_id="p", now=None)
    assert seen == [False]
    assert gc.isenabled()
