"""Weighted fair sharing in the pure core: the share of a node, the order in which a pass
admits the tasks that must borrow, and the condition of a fair-share reclaim (no reclaim
back and forth), with property tests over random cohorts."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.scheduling.fairshare import FairShares, fair_order
from app.scheduling.plugins.quota import CohortRow, QuotaBook, QuotaRow
from app.scheduling.preemption import VictimIndex
from app.scheduling.reclaim import ReclaimBook, book_displaced, fair_test, plan_reclaim
from app.scheduling.records import ClaimedTask
from app.scheduling.shares import share_of

from .factories import spec
from .test_reclaim_properties import COHORT, REQS, SETTINGS, World, worlds

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("borrowed", "lendable", "weight", "share"),
    [
        pytest.param((0, 0, 0), (8000, 0, 0), 1.0, 0.0, id="borrows-nothing"),
        pytest.param((2000, 0, 0), (8000, 0, 0), 1.0, 0.25, id="quarter"),
        pytest.param((6000, 0, 0), (8000, 0, 0), 3.0, 0.25, id="weight-divides"),
        pytest.param((1000, 4096, 0), (8000, 8192, 0), 1.0, 0.5, id="dominant-resource"),
        pytest.param((1000, 0, 0), (0, 0, 0), 1.0, math.inf, id="nothing-to-lend"),
    ],
)
def test_share_is_the_dominant_borrowed_resource_over_weight(borrowed, lendable, weight, share):
    assert share_of(borrowed, lendable, weight) == share


def _book(nominals: dict[str, int], weights: dict[str, float], used=None) -> QuotaBook:
    used = used or {}
    rows = [QuotaRow(t, "py", "cpuMillis", "c", n, None, None, used.get(t, 0))
            for t, n in nominals.items()]
    return QuotaBook(rows, {t: "c" for t in nominals}, (), weights)


def _tasks(order: list[tuple[str, int]]) -> list[tuple[ClaimedTask, object]]:
    """Return claimed tasks of 1000m, in ``order`` of (tenant, priority)."""
    out = []
    for seq, (tenant, priority) in enumerate(order):
        task_id = uuid.UUID(int=seq + 1)
        out.append((ClaimedTask(task_id, tenant, seq, priority, "{}", NOW, 0),
                    spec(tenant=tenant, task_id=str(task_id),
                         requests={"cpuMillis": 1000})))
    return out


def _admit(tasks, book: QuotaBook, decayed=None) -> list[str]:
    """Return the tenants of the tasks the book admits, in the order fair_order gives (each
    placed as a pass places it)."""
    got = []
    shares = FairShares(book, decayed=decayed)
    for task, s in fair_order(tasks, book, shares):
        if book.refuse(s.tenant_id, s.runtime_class, s.total_requests) is None:
            book.add(s.tenant_id, s.runtime_class, s.total_requests)
            shares.placed(s.tenant_id, s.runtime_class, s.total_requests)
            got.append(task.tenant_id)
    return got


def test_a_pass_divides_borrowed_capacity_by_weight():
    # a (weight 1) submitted first, then b (weight 3): 8 cores to lend go 2 to 6.
    book = _book({"lender": 8000, "a": 0, "b": 0}, {"a": 1.0, "b": 3.0})
    got = _admit(_tasks([("a", 0)] * 12 + [("b", 0)] * 12), book)
    assert (got.count("a"), got.count("b")) == (2, 6)
    # Lowest share with the task first; equal shares by tenant id.
    assert got == ["b", "b", "a", "b", "b", "b", "a", "b"]


def test_priority_comes_before_share():
    book = _book({"lender": 8000, "a": 0, "b": 0}, {"a": 1.0, "b": 1.0}, {"a": 4000})
    got = _admit(_tasks([("b", 0), ("a", 5)]), book)
    assert got == ["a", "b"]


def test_tasks_within_nominal_keep_their_place():
    # a's first two tasks are within its nominal: they keep their turns though b's share
    # is lower; where a borrowing task's turn comes, b (lower share) goes first.
    book = _book({"lender": 8000, "a": 2000, "b": 0}, {"b": 3.0})
    tasks = _tasks([("a", 0), ("a", 0), ("a", 0), ("b", 0), ("a", 0), ("b", 0), ("b", 0)])
    order = []
    shares = FairShares(book)
    for task, s in fair_order(tasks, book, shares):
        order.append(f"{task.tenant_id}{task.seq}")
        book.add(s.tenant_id, s.runtime_class, s.total_requests)
        shares.placed(s.tenant_id, s.runtime_class, s.total_requests)
    # 10 cores to lend (the lender's 8 and a's 2). At a2's turn (a's share with it 0.1),
    # b3 (1/10/3) and b5 (2/10/3) go first; then b6 ties a2 at 0.1: by tenant id, a2;
    # at a4's turn (0.2), b6 first.
    assert order == ["a0", "a1", "b3", "b5", "a2", "b6", "a4"]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2)), max_size=30),
       st.dictionaries(st.sampled_from("abc"), st.integers(0, 4), max_size=3),
       st.dictionaries(st.sampled_from("abc"), st.sampled_from([0.5, 1.0, 3.0]), max_size=3))
@SETTINGS
def test_fair_order_is_a_deterministic_permutation(order, nominal, weights):
    nominals = {"lender": 6000, **{t: n * 1000 for t, n in nominal.items()}}
    tasks = _tasks(order)
    runs = [_admit(tasks, _book(nominals, weights)) for _ in range(2)]
    assert runs[0] == runs[1]
    book = _book(nominals, weights)
    seen = [t.id for t, _ in fair_order(tasks, book, FairShares(book))]
    assert sorted(seen) == sorted(t.id for t, _ in tasks)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2)), max_size=12),
       st.dictionaries(st.sampled_from("abc"), st.integers(0, 8), max_size=3),
       st.dictionaries(st.sampled_from("abc"), st.integers(0, 3), max_size=3))
@SETTINGS
def test_a_pass_that_cannot_borrow_keeps_the_policy_order(order, nominal, used):
    # may_borrow says no task can have to borrow whatever is placed before it; then no task
    # borrows in any order, and the pass keeps the policy's order.
    nominals = {t: n * 1000 for t, n in nominal.items()}
    usage = {t: n * 1000 for t, n in used.items()}
    tasks = _tasks(order)
    book = _book(nominals, {}, usage)
    needs = [(s.tenant_id, s.runtime_class, s.total_requests) for _, s in tasks]
    if book.may_borrow(needs):
        assert any(book.borrows(t, rc, (sum(n[0] for u, _, n in needs if u == t), 0, 0))
                   for t, rc, _ in needs)
        return
    for ordered in (tasks, tasks[::-1]):
        book = _book(nominals, {}, usage)
        for _, s in ordered:
            assert not book.borrows(s.tenant_id, s.runtime_class, s.total_requests)
            book.add(s.tenant_id, s.runtime_class, s.total_requests)
    book = _book(nominals, {}, usage)
    assert list(fair_order(tasks, book, FairShares(book))) == tasks


def test_may_borrow_sees_a_tenant_whose_tasks_together_go_above_nominal():
    book = _book({"lender": 8000, "a": 2000, "b": 1000}, {})
    assert not book.may_borrow([("a", "py", (1000, 0, 0)), ("a", "py", (1000, 0, 0)),
                                ("b", "py", (1000, 0, 0)), ("x", "other", (10**6, 0, 0))])
    assert book.may_borrow([("a", "py", (1000, 0, 0)), ("b", "py", (1000, 0, 0)),
                            ("a", "py", (1000, 0, 0)), ("a", "py", (1, 0, 0))])


def test_decayed_usage_orders_the_tenant_that_consumed_less_first():
    # Equal shares now; a consumed more recently.
    decayed = {("a", "py"): (6000.0, 0.0, 0.0), ("b", "py"): (1000.0, 0.0, 0.0)}
    tasks = _tasks([("a", 0), ("b", 0)])
    on = _admit(tasks, _book({"lender": 8000, "a": 0, "b": 0}, {}), decayed)
    off = _admit(tasks, _book({"lender": 8000, "a": 0, "b": 0}, {}))
    assert (on, off) == (["b", "a"], ["a", "b"])


def _fair_plan(world: World, tenant: str, req, weights):
    rows = world.rows()
    quota = QuotaBook(rows, COHORT, (), weights)
    book = ReclaimBook(rows, COHORT, quota=quota)
    snap = world.snapshot()
    s = spec(tenant=tenant, task_id="new", requests={"cpuMillis": req[0], "memoryMiB": req[1]})
    test = fair_test(book, s)
    index = VictimIndex(snap, [x.victim() for x in world.leases])
    return plan_reclaim(s, snap, index, book, fair=test), book, s


WEIGHTS = st.fixed_dictionaries({t: st.sampled_from([0.5, 1.0, 2.0, 3.0]) for t in COHORT})


@given(worlds(), st.sampled_from(["a", "b", "z"]), REQS, WEIGHTS)
@SETTINGS
def test_a_fair_share_reclaim_leaves_the_reclaimer_at_most_each_victims_share(
    world, tenant, req, weights
):
    planned, book, s = _fair_plan(world, tenant, req, weights)
    if planned is None or not planned.victims:
        return
    rc = s.runtime_class
    victims = {v.tenant_id for v in planned.victims}
    assert tenant not in victims and all(COHORT[t] == COHORT[tenant] for t in victims)
    before = {t: book.share(t, rc) for t in victims}
    book_displaced(book, s, planned.victims)
    mine = book.share(tenant, rc)
    for t in victims:
        # LessThanOrEqualToFinalShare, and the victim was above the reclaimer before.
        assert mine <= book.share(t, rc) + 1e-12
        assert before[t] > mine - 1e-12
        # No reclaim back: a task of the victim's tenant never sees the reclaimer above it.
        back = spec(tenant=t, task_id="back", requests={"cpuMillis": req[0],
                                                         "memoryMiB": req[1]})
        assert not fair_test(book, back).lender(tenant)


def test_fair_share_reclaim_takes_from_the_tenant_above_its_share_only():
    # 8 cores, a holds all 8 (share 1.0); b (weight 3) takes up to 6, never a 7th.
    from .test_reclaim_properties import Lease

    leases = [Lease(f"l{i}", "a", 0, float(i), (1000, 0, 0), ((f"p{i % 2}", 1),))
              for i in range(8)]
    world = World({"p0": (4000, 8192, 0), "p1": (4000, 8192, 0)}, leases,
                  {"a": (0, 0), "b": (0, 0), "z": (0, 0)}, False)
    rows = [*world.rows(), QuotaRow("lender", "py", "cpuMillis", "c", 8000, None, None, 0)]
    quota = QuotaBook(rows, {**COHORT, "lender": "c"}, (), {"b": 3.0})
    book = ReclaimBook(rows, {**COHORT, "lender": "c"}, quota=quota)
    snap = world.snapshot()
    index = VictimIndex(snap, [x.victim() for x in leases])
    taken: set[str] = set()
    got = 0
    for i in range(8):
        s = spec(tenant="b", task_id=f"b{i}", requests={"cpuMillis": 1000})
        planned = plan_reclaim(s, snap, index, book, taken=taken, fair=fair_test(book, s))
        if planned is None:
            break
        assert [v.tenant_id for v in planned.victims] == ["a"]
        taken.update(v.task_id for v in planned.victims)
        book_displaced(book, s, planned.victims)
        got += 1
    assert got == 6
    assert np.isclose(book.share("a", "py"), book.share("b", "py"))


def test_a_tree_compares_shares_level_by_level_from_the_top():
    # org (8 cores of its own) -> teams t1 (x) and t2 (y, z), nothing of their own. t2 as a
    # team borrows more (y and z 1000 each) than t1 (x 1500): x goes before z, though x
    # alone borrows more than z.
    rows = [CohortRow("org", "py", "cpuMillis", None, 8000, 8000, 0, 8000, 3500),
            CohortRow("t1", "py", "cpuMillis", "org", 0, 0, 0, None, 1500),
            CohortRow("t2", "py", "cpuMillis", "org", 0, 0, 0, None, 2000)]
    tenants = [QuotaRow("x", "py", "cpuMillis", "t1", 0, None, None, 1500),
               QuotaRow("y", "py", "cpuMillis", "t2", 0, None, None, 1000),
               QuotaRow("z", "py", "cpuMillis", "t2", 0, None, None, 1000)]
    book = QuotaBook(tenants, {"x": "t1", "y": "t2", "z": "t2"}, rows, {})
    shares = FairShares(book)
    assert shares.key("x", "py", (1000, 0, 0)) == ((0.1875, "t1"), (0.3125, "x"))
    assert shares.key("z", "py", (1000, 0, 0)) == ((0.25, "t2"), (0.25, "z"))
    got = [t.tenant_id for t, _ in fair_order(_tasks([("z", 0), ("x", 0)]), book, shares)]
    assert got == ["x", "z"]
