"""The garbage collector: frozen at start-up in the API process; tuned, and paused for each
pass, in a reconciler process of its own."""

from __future__ import annotations

import gc
import weakref

from app import gc_tuning
from app.gc_tuning import FULL_MIN, FULL_RATIO, GEN0_THRESHOLD, gc_frozen, gc_paused, gc_tuned


def test_the_collector_is_tuned_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with gc_tuned():
        assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > frozen  # the objects alive at start-up
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_api_process_only_freezes_what_is_alive_at_start_up() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with gc_frozen():
        assert gc.get_freeze_count() > frozen
        assert gc.get_threshold() == before
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_the_app_freezes_at_start_up_and_never_pauses_the_collector() -> None:
    import inspect

    from app import main

    source = inspect.getsource(main)
    assert "gc_frozen()" in source
    assert "gc_paused" not in source and "gc_tuned" not in source


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


async def _collector_during_a_pass(monkeypatch, **guard) -> list[bool]:
    from app.reconciler import passes

    seen: list[bool] = []

    async def attempt(operation, what):
        seen.append(gc.isenabled())
        return passes.PassResult(pass_id="p")

    ctx = passes.PassContext(db=None, config=None, slots=frozenset(), rng=lambda: 0.0,
                             sleep=None, **guard)
    monkeypatch.setattr(passes.PassContext, "retry", lambda self, op, what: attempt(op, what))
    await passes.pass_run(ctx, pass_id="p", now=None)
    assert gc.isenabled()
    return seen


async def test_a_pass_leaves_the_collector_on_by_default(monkeypatch) -> None:
    # The reconciler in the API's process (``berth serve``) passes with the collector on.
    assert await _collector_during_a_pass(monkeypatch) == [True]


async def test_a_reconciler_process_pass_runs_with_the_collector_off(monkeypatch) -> None:
    assert await _collector_during_a_pass(monkeypatch, pass_guard=gc_paused) == [False]


def test_only_the_reconcile_process_pauses_the_collector() -> None:
    import inspect

    from app.reconciler import process

    assert "pass_guard=gc_paused" in inspect.getsource(process._run)
    assert "pass_guard" not in inspect.getsource(process.reconciler_background)


class _Node:
    """A small object that can hold a reference (a cycle) and be watched by a weak one."""

    __slots__ = ("__weakref__", "other")

    def __init__(self) -> None:
        self.other: object = None


def _tracked(obj: object) -> bool:
    """Return whether ``obj`` is in one of the collector's generations (not frozen)."""
    return any(o is obj for o in gc.get_objects())


def test_a_pause_freezes_what_outlives_it_and_reference_counting_still_frees_it() -> None:
    with gc_paused():
        kept = _Node()
        kept.other = [kept.other]  # a container, tracked by the collector
    held = kept.other
    assert not _tracked(held)  # frozen: no collection walks it any more
    watch = weakref.ref(kept)
    del kept, held
    assert watch() is None  # freed at once, frozen or not


def test_cycles_frozen_by_pauses_are_collected_once_the_heap_grows(monkeypatch) -> None:
    monkeypatch.setattr(gc_tuning, "_settled", gc_tuning._Settled())
    monkeypatch.setattr(gc_tuning, "FULL_EVERY_SECONDS", 0.0)  # not a CPU-minute per test
    with gc_paused():
        a, b = _Node(), _Node()
        a.other, b.other = b, a
    watch = weakref.ref(a)
    del a, b
    gc.collect()
    assert watch() is not None  # frozen: the garbage waits for a full collection
    base = gc_tuning._settled.base
    assert base is not None
    with gc_paused():  # a pass that keeps a quarter of the heap more alive
        grown = [_Node() for _ in range(max(FULL_MIN, int(base * FULL_RATIO)) + 10_000)]
    assert watch() is None
    assert gc_tuning._settled.full == 1
    del grown


async def test_a_snapshot_a_pass_replaced_is_freed_though_it_was_frozen(db) -> None:
    from app.config import SHARD_SLOTS
    from app.ledger.pools import pool_status_set
    from app.reconciler import Reconciler, ReconcilerConfig
    from tests.factories import NOW, heartbeat_add, pool_add, spec_make, tasks_add

    async with db.transaction() as conn:
        for pid in ("p1", "p2"):
            await pool_add(conn, pid, tenants=["t1"], capacity=(1000, 1000, 0))
            await heartbeat_add(conn, f"rt-{pid}", at=NOW)
        await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=100))
    rec = Reconciler(db, ReconcilerConfig(), owner_id="test", slots=frozenset(range(SHARD_SLOTS)),
                     pass_guard=gc_paused)
    assert (await rec.run_once(now=NOW)).snapshot_rebuilt
    snapshot = rec._snapshot_cache.snapshot
    assert snapshot is not None and not _tracked(snapshot)  # frozen when the pass ended
    watch = weakref.ref(snapshot.fresh)
    del snapshot

    async with db.transaction() as conn:  # a pool row changes: the next pass rebuilds
        await pool_status_set(conn, pool_id="p1", status="CORDONED", reason=None,
                              drain_deadline=None, now=NOW)
        await tasks_add(conn, tenant="t1", count=1, spec=spec_make(cpu=100))
    gc.disable()  # freed by reference counting, not found by a collection
    try:
        assert (await rec.run_once(now=NOW)).snapshot_rebuilt
        assert watch() is None
    finally:
        gc.enable()
