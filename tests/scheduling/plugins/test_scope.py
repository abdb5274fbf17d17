"""What a plugin declares about its scope is checked, not trusted.

A plugin of scope ``audience`` or ``placement_class`` has its verdict computed once per class
and kept for every task of the class, and carried into the next pass's snapshot: it must
read nothing a task or a pass changes. For every registered plugin of such a scope, its
verdict for one task equals a fresh recomputation for another task of the same placement
class, with other requests and labels, on a snapshot whose usage moved, with the pass's
assumed placements on top.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import registry
from app.scheduling.plugins.base import PLACEMENT_CLASS, TASK, FilterPlugin
from app.scheduling.reasons import CODE, PASS, Reason
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec
from tests.scheduling.test_properties import LABELS, SETTINGS, specs, with_assumed, worlds

CLASS_SCOPED = [r for r in registry.REGISTRY if r.scope != TASK]


def _verdict(plugin: object, cycle: Cycle, idx: np.ndarray) -> tuple:
    """Return a plugin's verdict on the pools ``idx``: a filter's codes, a score's values."""
    if isinstance(plugin, FilterPlugin):
        out = plugin.filter_many(cycle, idx)
        return ("filter", tuple(np.full(len(idx), PASS) if out is None else out.tolist()))
    if not plugin.applies(cycle):  # type: ignore[attr-defined]
        return ("score", None)
    raw = plugin.score_many(cycle, idx)  # type: ignore[attr-defined]
    return ("score", tuple(np.round(plugin.normalize(cycle, raw), 9).tolist()))  # type: ignore[attr-defined]


def _other_task(s: CompiledSpec, cpu: int, labels: dict[str, str]) -> CompiledSpec:
    """Return a task of the same placement class with other requests and labels."""
    return s._replace(requests=(cpu, s.requests[1], s.requests[2]),
                      labels=frozenset(labels.items()), task_id="other")


def _moved(snap: Snapshot, shift: int) -> Snapshot:
    """Return the next pass's snapshot of the same pools, with their usage moved (health and
    ledger presence held: otherwise the class state is not carried over)."""
    reserved = [tuple(max(int(v) - shift, 0) for v in row) for row in snap.reserved.tolist()]
    capacity = [tuple(c) if has else None
                for c, has in zip(snap.cap.tolist(), snap.has_ledger.tolist(), strict=True)]
    return snap.with_usage(capacity=capacity, reserved=reserved, fresh=snap.fresh.tolist())


def _same_verdict(plugin: object, world, s: CompiledSpec, other: CompiledSpec, used,
                  shift: int) -> bool:
    pools, placed = world
    snap = Snapshot.build(pools, placed)
    idx = np.arange(snap.n, dtype=np.intp)
    once = _verdict(plugin, Cycle(s, snap, None), idx)
    later = _moved(snap, shift)
    assumed = with_assumed(later, pools, [u for u in used if u[0] in later.pos])
    return once == _verdict(plugin, Cycle(other, later, assumed), idx)


@pytest.mark.parametrize("record", CLASS_SCOPED, ids=lambda r: r.name)
@SETTINGS
@given(world=worlds(), s=specs(), cpu=st.integers(1, 4000), labels=LABELS,
       used=st.lists(st.tuples(st.sampled_from([f"p{i:02d}" for i in range(10)]), LABELS),
                     max_size=4),
       shift=st.integers(0, 2000))
def test_a_class_scope_verdict_equals_a_fresh_per_task_recomputation(
    record, world, s, cpu, labels, used, shift
):
    plugin = record.plugin()
    assert _same_verdict(plugin, world, s, _other_task(s, cpu, labels), used, shift)


class ReadsUsage(FilterPlugin):
    """A filter that declares class scope but reads the pools' usage."""

    NAME = "reads_usage"
    REASONS = (Reason.INSUFFICIENT_CPU,)
    SCOPE = PLACEMENT_CLASS

    def filter_many(self, cycle: Cycle, idx: np.ndarray) -> np.ndarray | None:
        busy = cycle.snapshot.reserved[idx, 0] > 0
        return np.where(busy, np.int16(CODE[Reason.INSUFFICIENT_CPU]), np.int16(PASS))


def test_the_check_catches_a_class_scope_plugin_that_reads_usage():
    from tests.scheduling.factories import pool, spec

    world = ([pool("p00", reserved=(1000, 0, 0))], [])
    s = spec()
    assert not _same_verdict(ReadsUsage(), world, s, _other_task(s, 100, {}), [], 1000)
