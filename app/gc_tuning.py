"""Python's cyclic garbage collector in Berth's processes.

The API process (``berth serve``, :func:`gc_frozen`) only freezes what is alive once the app
has started (modules, routes, schemas): they live as long as the process, so the collector
need not walk them again; reference counting still frees whatever of them is dropped. The
collector itself runs as Python configures it, also while the in-process reconciler passes.

A reconciler process of its own (``berth reconcile``) also tunes the collector for its loop:

* :func:`gc_tuned` freezes what is alive at start-up and raises the first-generation
  threshold to :data:`GEN0_THRESHOLD` allocations, so that a pass's short-lived objects are
  mostly freed by reference counting before a collection looks at them;
* :func:`gc_paused` turns the collector off for the length of a pass: a pass keeps some 100
  objects per claimed task alive until it commits, all freed by reference counting once it
  ends, so a collection meanwhile would only walk them. The last of overlapping pauses
  freezes what is alive when it ends (:func:`gc_settle`): what a pass leaves alive is
  mostly long-lived (the snapshot, memo entries, compiled specs). Cycles among frozen
  objects wait for a full collection of everything frozen, which runs at the end of a pass
  once the heap grew by :data:`FULL_RATIO` of what the previous one left (at least
  :data:`FULL_MIN` memory blocks), no sooner than :data:`FULL_EVERY_SECONDS` of process CPU
  and :data:`FULL_SPACING` times the previous one's CPU after it, unless the heap doubled.
  The heap is measured without walking anything: ``sys.getallocatedblocks()``, net of
  frees, so caches that churn do not count as growth and uncollected cycles do.

Only ``berth reconcile`` pauses the collector: it serves no requests.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "FULL_EVERY_SECONDS", "FULL_MIN", "FULL_RATIO", "FULL_SPACING", "GEN0_THRESHOLD",
    "gc_frozen", "gc_paused", "gc_settle", "gc_tuned",
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
def gc_frozen() -> Iterator[None]:
    """Freeze the objects alive now; unfreeze them on exit."""
    gc.freeze()  # O(1): the collector's lists are spliced, not walked
    try:
        yield
    finally:
        gc.unfreeze()


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
    base = s.base
    if base is None and not full:
        s.base = blocks
        s.after = time.process_time() + FULL_EVERY_SECONDS
    elif full or base is None or (grown := blocks - base) > max(FULL_MIN, base) or (
        grown > max(FULL_MIN, base * FULL_RATIO) and time.process_time() >= s.after
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
