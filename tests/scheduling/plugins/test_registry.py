"""The registry: every reason code belongs to exactly one filter, which is all it returns."""

from __future__ import annotations

import numpy as np
from hypothesis import given

from app.scheduling.cycle import Cycle
from app.scheduling.plugins import names
from app.scheduling.plugins.registry import FILTERS, reason_plugins
from app.scheduling.reasons import CODE, PASS, Reason
from app.scheduling.snapshot import Snapshot
from tests.scheduling.test_properties import SETTINGS, specs, worlds


def test_every_reason_code_maps_to_one_plugin():
    mapping = reason_plugins()
    assert set(mapping) == {str(r) for r in Reason}
    assert mapping[str(Reason.GANG_UNSATISFIABLE)] == names.GANG
    assert mapping[str(Reason.INSUFFICIENT_LLM_SLOTS)] == names.CAPACITY
    assert mapping[str(Reason.ANTI_AFFINITY_VIOLATED)] == names.REQUIRED_AFFINITY


def test_filters_declare_disjoint_reason_sets():
    declared = [r for cls in FILTERS.values() for r in cls.REASONS]
    assert len(declared) == len(set(declared))
    assert all(cls.REASONS for cls in FILTERS.values())


@SETTINGS
@given(worlds(), specs())
def test_a_filter_returns_only_the_reasons_it_declares(world, spec):
    pools, placed = world
    snap = Snapshot.build(pools, placed)
    cycle = Cycle(spec, snap, None)
    idx = np.arange(snap.n, dtype=np.intp)
    for name, cls in FILTERS.items():
        codes = cls().filter_many(cycle, idx)
        if codes is not None:
            allowed = {CODE[r] for r in cls.REASONS} | {PASS}
            assert set(codes.tolist()) <= allowed, name
