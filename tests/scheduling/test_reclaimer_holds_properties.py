"""A reclaimer keeps its holds only while its quota admits it: after a planned pass, a
reclaimer that still holds capacity passes its tenant's quota (judged without its own need,
which the pass counts as its tenant's usage), and one its quota refuses gives its holds back
in that pass and is not placed on them.

Worlds are generated: a reclaimer of tenant ``b`` holding part of its need on some pools
(its victims still stopping, or stopped), its tenant's nominal changed or not since it
started, the borrowing tenant ``a``'s usage, pools cordoned or shrunk since, and other tasks
in the pass. The planner (:func:`~app.scheduling.planner.plan_pass`) plans one pass; the plan
is then checked.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from app.scheduling.inputs import PassInputs, ReclaimInputs
from app.scheduling.planner import plan_pass
from app.scheduling.plugins.quota import QuotaBook, QuotaRow
from app.scheduling.plugins.registry import profile
from app.scheduling.records import RECLAIMING, ClaimedTask
from app.scheduling.spec import StoredSpecs
from tests.scheduling.factories import pool, snapshot
from tests.scheduling.test_holds_properties import NOW, SETTINGS_PASS, _task
from tests.scheduling.test_properties import SETTINGS

POOLS = ["q0", "q1", "q2"]


def _row(tenant: str, nominal: int, used: int) -> QuotaRow:
    return QuotaRow(tenant, "py", "cpuMillis", "c", nominal, None, None, used)


@st.composite
def worlds(draw):
    need = draw(st.sampled_from([1000, 2000, 3000]))
    on = draw(st.lists(st.sampled_from(POOLS), min_size=1, max_size=2, unique=True))
    held = {p: (draw(st.integers(1, need // 1000)) * 1000 // len(on), 0, 0) for p in on}
    pools = []
    for pid in POOLS:
        cap = draw(st.sampled_from([0, 1000, 2000, 4000]))
        reserved = draw(st.integers(0, cap))
        if pid in held:  # what a held unit reserves is in its pool's ledger already
            cap = max(cap, held[pid][0])
            reserved = max(reserved, held[pid][0])
        pools.append(pool(pid, tenant_ids=frozenset({"a", "b"}), capacity=(cap, 8192, 0),
                          reserved=(reserved, 0, 0),
                          status=draw(st.sampled_from(["ACTIVE", "ACTIVE", "CORDONED"]))))
    # b's need is counted as its usage, as a pass reads a waiting reclaimer's rows.
    rows = (
        _row("a", draw(st.sampled_from([0, 1000, 2000])),
             draw(st.sampled_from([0, 2000, 4000]))),
        _row("b", draw(st.sampled_from([0, 1000, 2000, 4000])),
             draw(st.sampled_from([0, 1000])) + need),
    )
    stopping = draw(st.booleans())
    others = draw(st.integers(0, 3))
    return pools, need, held, rows, stopping, others


def _inputs(world) -> tuple[PassInputs, ClaimedTask]:
    pools, need, held, rows, stopping, others = world
    reclaimer = _task(1, "b", need, pending=RECLAIMING)
    tasks = [reclaimer] + [_task(10 + i, "a", 1000, pending=None) for i in range(others)]
    compiled, invalid = StoredSpecs().compile_all(tasks)
    assert not invalid
    inputs = PassInputs(
        now=NOW, settings=SETTINGS_PASS, profile=profile("spread"),
        snapshot=snapshot(pools), tasks=tuple(compiled), quota_rows=rows,
        cohorts={"a": "c", "b": "c"}, holds={reclaimer.id: held},
        waiting={reclaimer.id: (1, NOW + timedelta(seconds=30))} if stopping else {},
        reclaim=ReclaimInputs(frozenset({reclaimer.id})),
    )
    return inputs, reclaimer


def _refused(world) -> bool:
    """Return whether b's quota refuses the reclaimer, judged without its own need."""
    rows = [dataclasses.replace(r, used=r.used - world[1]) if r.tenant_id == "b" else r
            for r in world[3]]
    return QuotaBook(rows, {"a": "c", "b": "c"}).refuse("b", "py", (world[1], 0, 0)) is not None


@SETTINGS
@given(worlds())
def test_a_reclaimer_keeps_its_holds_only_while_its_quota_admits_it(world):
    inputs, reclaimer = _inputs(world)
    plan = plan_pass(inputs)
    placed = [p.task.id for p in plan.placed]
    given_back = set(plan.holds.given_back(placed, plan.unclaims))
    handed = {u.task_id: u for u in plan.unclaims}
    if _refused(world):
        # Its holds go back in this pass, and it is not placed on them.
        assert reclaimer.id not in placed
        assert reclaimer.id in given_back
        assert handed[reclaimer.id].reason in ("quota_exceeded", "quota_borrow_unavailable")
    elif reclaimer.id not in placed and reclaimer.id not in given_back:
        # Kept: still reclaiming (waiting for its victims, or for room its holds lack).
        assert handed[reclaimer.id].reason == RECLAIMING or world[4]
