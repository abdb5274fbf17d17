"""Holds are never orphaned: after a planned pass, every held unit belongs to a task that
passes its quota and whose plan still uses that pool; every other holder gives its holds
back in the same pass.

Worlds are generated: a nominee of tenant ``a`` holding part of its need on some pools, its
tenant's and its cohort's quota rows (usage moved by other work, a lender that may have
left), pools cordoned or shrunk since (leases ended or not), the nominee's nomination
possibly ended elsewhere (its task cancelled), and other tasks in the pass. The planner
(:func:`~app.scheduling.planner.plan_pass`) plans one pass; the plan is then checked.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.scheduling.inputs import NominationInputs, PassInputs, PassSettings, ReclaimInputs
from app.scheduling.planner import plan_pass
from app.scheduling.plugins.quota import QuotaBook, QuotaRow
from app.scheduling.plugins.registry import profile
from app.scheduling.preemption import Victim
from app.scheduling.records import NOMINATED, PREEMPTING, ClaimedTask, Kind, Nomination
from app.scheduling.spec import StoredSpecs
from tests.scheduling.factories import pool, snapshot
from tests.scheduling.test_properties import SETTINGS

NOW = datetime(2026, 1, 1, tzinfo=UTC)
POOLS = ["q0", "q1", "q2"]
SETTINGS_PASS = PassSettings(
    top_k=4, policy="fifo", priority_aging_seconds=60.0, park_sweep_seconds=300.0,
    task_events_kept=100, preemption_grace_seconds=30.0, reclaim_min_runtime_seconds=0.0,
    nomination_seconds=60.0,
)


def _task(n: int, tenant: str, cpu: int, *, pending: str | None) -> ClaimedTask:
    text = orjson.dumps({"runtimeClass": "py", "requests": {"cpuMillis": cpu}}).decode()
    return ClaimedTask(uuid.UUID(int=n), tenant, n, 0, text, NOW - timedelta(hours=1), 0,
                       pending_code=pending, logged_at=NOW - timedelta(hours=1))


def _row(tenant: str, cohort: str, nominal: int, used: int) -> QuotaRow:
    return QuotaRow(tenant, "py", "cpuMillis", cohort, nominal, None, None, used)


@st.composite
def worlds(draw):
    pools = []
    for pid in POOLS:
        cap = draw(st.sampled_from([0, 1000, 2000, 4000]))
        pools.append(pool(pid, tenant_ids=frozenset({"a", "b"}), capacity=(cap, 8192, 0),
                          reserved=(draw(st.integers(0, cap)), 0, 0),
                          status=draw(st.sampled_from(["ACTIVE", "ACTIVE", "CORDONED"]))))
    need = draw(st.sampled_from([1000, 2000, 3000]))
    nominated = draw(st.lists(st.sampled_from(POOLS), min_size=1, max_size=2, unique=True))
    held = {p: (draw(st.integers(0, need // 1000)) * 1000 // len(nominated), 0, 0)
            for p in nominated}
    # What a held unit reserves is in its pool's ledger already.
    pools = [p if p.id not in held else p.__class__(**{
        **{f: getattr(p, f) for f in p.__dataclass_fields__},
        "reserved": (min(p.reserved[0] + held[p.id][0], p.capacity[0]), 0, 0)})
        for p in pools]
    rows = (
        _row("a", "ca", draw(st.sampled_from([0, 1000, 4000])), draw(st.sampled_from(
            [0, 1000, 3000]))),
        *([_row("lender", "ca", draw(st.sampled_from([0, 2000, 4000])), 0)]
          if draw(st.booleans()) else []),
        _row("b", "cb", 16000, 0),
    )
    others = draw(st.integers(0, 3))
    state = draw(st.sampled_from(["ADMITTED", "ADMITTED", "CANCELLED"]))
    return pools, need, held, rows, others, state


def _inputs(world) -> tuple[PassInputs, ClaimedTask]:
    pools, need, held, rows, others, state = world
    nominee = _task(1, "a", need, pending=NOMINATED)
    tasks = [nominee] + [_task(10 + i, "b", 1000, pending=None) for i in range(others)]
    compiled, invalid = StoredSpecs().compile_all(tasks)
    assert not invalid
    nominations = tuple(
        Nomination(p, nominee.id, "py", 1, (need // len(held), 0, 0), NOW - timedelta(minutes=5),
                   0, 1, state)
        for p in held)
    inputs = PassInputs(
        now=NOW, settings=SETTINGS_PASS, profile=profile("spread"),
        snapshot=snapshot(pools), tasks=tuple(compiled), quota_rows=rows,
        cohorts={"a": "ca", "lender": "ca", "b": "cb"},
        holds={nominee.id: held},
        nomination=NominationInputs(nominations, {"py": ((nominee.id, 0, 1),)}, {}),
    )
    return inputs, nominee


@SETTINGS
@given(worlds())
def test_every_hold_kept_belongs_to_a_task_that_passes_quota_and_can_use_it(world):
    inputs, nominee = _inputs(world)
    plan = plan_pass(inputs)
    placed = [p.task.id for p in plan.placed]
    given_back = set(plan.holds.given_back(placed, plan.unclaims))
    handed = {u.task_id: u for u in plan.unclaims}
    if nominee.id in placed or nominee.id in given_back:
        return  # its holds became its placement, or go back in this pass
    # Kept: still nominated, within its quota, and its pools can still help it.
    kept = handed[nominee.id]
    assert kept.reason == NOMINATED
    assert nominee.id in plan.holds.kept
    book = QuotaBook(inputs.quota_rows, inputs.cohorts)
    assert book.refuse("a", "py", (world[1], 0, 0)) is None
    assert set(kept.pending_reason["poolIds"]) == set(world[2])
    assert plan.nominations_ended.get(nominee.id) is None


@SETTINGS
@given(worlds())
def test_a_nominee_its_quota_refuses_never_keeps_its_holds(world):
    inputs, nominee = _inputs(world)
    book = QuotaBook(inputs.quota_rows, inputs.cohorts)
    if book.refuse("a", "py", (world[1], 0, 0)) is None:
        return
    plan = plan_pass(inputs)
    given_back = plan.holds.given_back([p.task.id for p in plan.placed], plan.unclaims)
    assert nominee.id in given_back
    # Its nomination ends; one whose task is no longer admitted is recovery's to remove.
    assert plan.nominations_ended.get(nominee.id) == (
        "stale" if world[5] == "ADMITTED" else None)


def test_a_nominee_refused_by_work_placed_later_in_its_pass_gives_back_its_holds():
    """A nominee decided first (it fits nowhere, and its quota admits it then) whose tenant's
    later task of the same pass borrows what the cohort could lend it: once that task is
    placed the nominee's quota refuses it, so its nomination ends and its holds go back in
    this pass, not the next."""
    nominee = _task(1, "a", 3000, pending=NOMINATED)
    later = _task(2, "a", 2000, pending=None)
    compiled, invalid = StoredSpecs().compile_all([nominee, later])
    assert not invalid
    pools = [pool("q0", tenant_ids=frozenset({"a"}), capacity=(4000, 8192, 0),
                  reserved=(3000, 0, 0)),  # 2000m of other work, 1000m held for the nominee
             pool("q1", tenant_ids=frozenset({"a"}), capacity=(2000, 8192, 0))]
    rows = (_row("a", "ca", 0, 0), _row("lender", "ca", 4000, 0))
    inputs = PassInputs(
        now=NOW, settings=SETTINGS_PASS, profile=profile("spread"),
        snapshot=snapshot(pools), tasks=tuple(compiled), quota_rows=rows,
        cohorts={"a": "ca", "lender": "ca"}, holds={nominee.id: {"q0": (1000, 0, 0)}},
        nomination=NominationInputs(
            (Nomination("q0", nominee.id, "py", 1, (3000, 0, 0), NOW - timedelta(minutes=5),
                        0, 1, "ADMITTED"),),
            {"py": ((nominee.id, 0, 1), (later.id, 0, 2))}, {}),
    )
    plan = plan_pass(inputs)
    assert [(p.task.id, p.members) for p in plan.placed] == [(later.id, (("q1", 1),))]
    assert plan.nominations_ended == {nominee.id: "stale"}
    assert nominee.id not in plan.holds.kept
    assert plan.holds.given_back([later.id], plan.unclaims) == (nominee.id,)
    (handed,) = [u for u in plan.unclaims if u.task_id == nominee.id]
    assert handed.reason == "quota_borrow_unavailable"


def _waiting_preemptor(need: int) -> tuple[PassInputs, ClaimedTask]:
    """A preemptor of tenant a needing ``need`` waits for one victim of 1000m (still
    revoking, counted in a's 4000m of usage); a's nominal is 4000m, nothing to borrow."""
    task = _task(1, "a", need, pending=PREEMPTING)
    compiled, invalid = StoredSpecs().compile_all([task])
    assert not invalid
    inputs = PassInputs(
        now=NOW, settings=SETTINGS_PASS, profile=profile("spread"),
        snapshot=snapshot([pool("q0", tenant_ids=frozenset({"a"}), capacity=(4000, 8192, 0),
                                reserved=(4000, 0, 0))]),
        tasks=tuple(compiled), quota_rows=(_row("a", "ca", 4000, 4000),),
        cohorts={"a": "ca"}, holds={task.id: {"q0": (0, 0, 0)}},
        waiting={task.id: (1, NOW + timedelta(seconds=30))},
        reclaim=ReclaimInputs(revoking={("a", "py"): (1000, 0, 0)}),
    )
    return inputs, task


def test_a_waiting_preemptor_its_quota_refuses_gives_back_its_holds():
    """Its quota lowered since it started (3000m more than a's 3000m once its victim stops
    is past the nominal): its holds go back in this pass and it waits for its quota."""
    inputs, task = _waiting_preemptor(3000)
    plan = plan_pass(inputs)
    assert task.id in plan.holds.released
    assert [(u.task_id, u.reason) for u in plan.unclaims] == [(task.id, "quota_borrow_unavailable")]


def test_a_waiting_preemptor_is_judged_with_its_victims_stopped():
    """1000m more than a's 3000m once its victim stops fits a's nominal: it keeps waiting,
    though with its victim still running a would be over its nominal."""
    inputs, task = _waiting_preemptor(1000)
    plan = plan_pass(inputs)
    assert task.id not in plan.holds.released
    assert [(u.task_id, u.reason) for u in plan.unclaims] == [(task.id, PREEMPTING)]


def test_a_nominee_refused_by_a_reclaim_of_its_pass_gives_back_its_holds():
    """A nominee of b (4000m, b's whole nominal) decided first, then a task of b behind it
    reclaims 1000m that c borrows: from the next pass on that need counts as b's usage, so
    the nominee's quota refuses it (c lends nothing); its holds go back in this pass."""
    nominee = _task(1, "b", 4000, pending=NOMINATED)
    later = _task(2, "b", 1000, pending=None)
    compiled, invalid = StoredSpecs().compile_all([nominee, later])
    assert not invalid
    pools = [pool("q0", tenant_ids=frozenset({"b", "c"}), capacity=(4000, 8192, 0),
                  reserved=(4000, 0, 0)),  # 2000m of other work, 2000m held for the nominee
             pool("q1", tenant_ids=frozenset({"b", "c"}), capacity=(3000, 8192, 0),
                  reserved=(3000, 0, 0))]  # c's three borrowing leases
    victims = tuple(Victim(f"00000000-0000-0000-0000-0000000000c{i}", "c", 0,
                           (NOW - timedelta(hours=1)).timestamp(), (1000, 0, 0), (("q1", 1),))
                    for i in range(3))
    inputs = PassInputs(
        now=NOW, settings=SETTINGS_PASS, profile=profile("spread"),
        snapshot=snapshot(pools), tasks=tuple(compiled),
        quota_rows=(_row("b", "k", 4000, 0), _row("c", "k", 1000, 3000)),
        cohorts={"b": "k", "c": "k"}, holds={nominee.id: {"q0": (2000, 0, 0)}},
        reclaim=ReclaimInputs(victims=victims, leased_before=NOW.timestamp()),
        nomination=NominationInputs(
            (Nomination("q0", nominee.id, "py", 1, (4000, 0, 0), NOW - timedelta(minutes=5),
                        0, 1, "ADMITTED"),),
            {"py": ((nominee.id, 0, 1), (later.id, 0, 2))}, {}),
    )
    plan = plan_pass(inputs)
    assert [(g.task_id, g.kind) for g in plan.displaced] == [(later.id, Kind.RECLAIM)]
    assert plan.nominations_ended == {nominee.id: "stale"}
    assert plan.holds.given_back([], plan.unclaims) == (nominee.id,)
