"""Python's cyclic garbage collector, tuned for a serving process while an app runs.

A request that holds many objects at once — a task batch builds some 50,000 dicts, lists and
models for 1,000 items — triggers Python's collector every 700 allocations with the default
thresholds, and each full collection walks every object of the process: the imported
modules, FastAPI's routes, pydantic's schemas. Measured on a 1,000-item batch, collection
took about half of the request's CPU time. Two settings remove nearly all of it:

* ``gc.freeze()`` once the app has started moves the objects alive then (modules, routes,
  schemas) out of the collector's reach: they live as long as the process, and reference
  counting still frees whatever of them is dropped; only cycles among them (and garbage
  not yet collected at start-up) wait for :func:`gc_tuned`'s exit, which unfreezes them;
* a first-generation threshold of :data:`GEN0_THRESHOLD` allocations instead of 700, so
  that a request's short-lived objects are mostly freed by reference counting before a
  collection looks at them.

Refcounting frees almost everything a request makes; the collector only finds cycles, and
it still runs, just less often.

A reconciler pass is the extreme case: it keeps some 100 objects per claimed task alive until
it commits (claimed rows, compiled specs, decisions, placement documents, statement
arguments), so with a batch of 1,024 the collector ran several full collections per pass,
each walking every object of the process, and all of that was freed by reference counting
once the pass ended. Measured on the e2e dataset (1,000 pools, 20,000 tasks, one in-process
reconciler), collection took about 50 µs of the 270 µs of reconciler CPU per placement.
:func:`gc_paused` turns the collector off for the length of a pass (the reconciler process
also runs under :func:`gc_tuned`): the few cycles a pass leaves are found by the next
collection after it.

What a pass leaves alive is mostly long-lived: the snapshot's pool states and indexes, memo
entries, compiled specs. Left in the collector's generations, it was walked again by the
first-generation collection after a pass, by the second generation's every tenth, and by the
full collections: at 5,000 pools, 10–13 µs of process CPU per placement without
:func:`gc_tuned`, 2–3 µs with it (``scripts/pass_costs.py``). So the last of overlapping
:func:`gc_paused` blocks freezes what is alive when it ends, as :func:`gc_tuned` does at
start-up (O(1)): reference counting still frees a frozen object that is dropped (a replaced
snapshot, an evicted memo entry), and only cycles among frozen objects wait. They wait for a
full collection of everything frozen (unfreeze, collect, freeze again), which runs at the end
of a pass once the heap grew by :data:`FULL_RATIO` of what the previous one left (at least
:data:`FULL_MIN` memory blocks), CPython's own rule for its oldest generation, but no sooner
than :data:`FULL_EVERY_SECONDS` of process CPU and :data:`FULL_SPACING` times the previous
one's CPU after it (or after the first pause), unless the heap doubled: uncollected cycles
stay a bounded fraction of the heap, and full collections a bounded fraction of the CPU (at
5,000 pools one takes 90–170 ms, and the heap grows by a quarter within the first 20 passes,
some 3 s of CPU, as caches fill; the first full collection found 12 to 1,500 objects in
cycles). The heap is measured without walking anything: ``sys.getallocatedblocks()``, net of
frees, so caches that churn (compiled specs, memo entries) do not count as growth, and
uncollected cycles do.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "FULL_EVERY_SECONDS", "FULL_MIN", "FULL_RATIO", "FULL_SPACING", "GEN0_THRESHOLD",
    "gc_paused", "gc_settle", "gc_tuned",
]

#: Allocations (net of frees) between first-generation collections.
GEN0_THRESHOLD = 10_000
#: Growth of the heap since the last full collection, as a fraction of the heap it left, that
#: makes the end of the next :func:`gc_paused` block collect everything (CPython's rule for
#: its oldest generation, in memory blocks rather than objects).
FULL_RATIO = 0.25
#: ... and at least this many memory blocks.
FULL_MIN = 20_000
#: ... and no sooner than this many times the process CPU the previous full collection took
#: after it (full collections take at most 1 % of the process's CPU), unless the heap doubled.
FULL_SPACING = 100
#: ... and no sooner than this much process CPU (seconds) after the previous one, or after the
#: first pause ended (while the caches of a new process fill), unless the heap doubled.
FULL_EVERY_SECONDS = 60.0


@contextmanager
def gc_tuned() -> Iterator[None]:
    """Freeze the objects alive now and raise the first-generation threshold; restore both
    on exit."""
    previous = gc.get_threshold()
    gc.freeze()  # O(1): the collector's lists are spliced, not walked
    gc.set_threshold(GEN0_THRESHOLD, previous[1], previous[2])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
        _settled.reset()


class _Settled:
    """The heap when :func:`gc_settle` last collected everything, and how often it did."""

    __slots__ = ("base", "full", "after")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        #: Memory blocks allocated after the last full collection (None: none yet).
        self.base: int | None = None
        #: Full collections run.
        self.full = 0
        #: Process CPU time before which only a doubled heap calls for the next one.
        self.after = 0.0


_settled = _Settled()


def gc_settle(*, full: bool = False) -> bool:
    """Freeze the objects alive now; collect everything first if the heap grew by more than
    :data:`FULL_RATIO` (and :data:`FULL_MIN` blocks) since the last full collection and
    :data:`FULL_EVERY_SECONDS` and :data:`FULL_SPACING` allow it, if the heap doubled, or if
    ``full``. Return whether it collected.

    The heap is measured in memory blocks allocated (``sys.getallocatedblocks()``, every
    small object, tracked by the collector or not): net of frees, so a cache that churns
    does not count, and uncollected cycles do. The first call takes the heap as it is then
    for the base.
    """
    s = _settled
    blocks = sys.getallocatedblocks()
    if s.base is None and not full:
        s.base = blocks
        s.after = time.process_time() + FULL_EVERY_SECONDS
    elif full or (grown := blocks - s.base) > max(FULL_MIN, s.base) or (
        grown > max(FULL_MIN, s.base * FULL_RATIO) and time.process_time() >= s.after
    ):
        started = time.process_time()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        s.base = sys.getallocatedblocks()
        s.full += 1
        ended = time.process_time()
        s.after = ended + max(FULL_EVERY_SECONDS, FULL_SPACING * (ended - started))
        return True
    gc.freeze()  # O(1): the collector's lists are spliced, not walked
    return False


#: Open :func:`gc_paused` blocks of the process (passes of several reconcilers may overlap).
_paused = 0
#: Whether the first of them turned the collector off (and the last one turns it on).
_disabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Turn the cyclic collector off while the block runs; the last of overlapping blocks
    freezes what is alive then (:func:`gc_settle`) and turns the collector on again, if the
    first one turned it off."""
    global _paused, _disabled
    if _paused == 0:
        _disabled = gc.isenabled()
        gc.disable()
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1
        if _paused == 0 and _disabled:
            gc_settle()
            gc.enable()
