"""QuotaBook over a tree of cohorts: a tenant borrows from its cohort's other members
before its cohort borrows from its parent, every level's limit refuses, a guarantee is never
refused, and each node's share for fair sharing."""

from __future__ import annotations

import pytest

from app.scheduling.plugins.quota import CohortRow, QuotaBook, QuotaRow
from app.scheduling.reasons import Reason


def _tenant(tenant: str, cohort: str, nominal: int, used: int = 0) -> QuotaRow:
    return QuotaRow(tenant, "std", "cpuMillis", cohort, nominal, None, None, used)


def _cohort(cohort: str, parent: str | None, cap: int, used: int = 0,
            lim: int | None = None, weight: float = 1.0) -> CohortRow:
    return CohortRow(cohort, "std", "cpuMillis", parent, 0, cap, cap, cap if parent is None
                     else lim, used, weight)


def _org() -> QuotaBook:
    """org -> team1 (a, b: 4000m each), team2 (c: 8000m); everyone lends everything."""
    return QuotaBook(
        [_tenant("a", "team1", 4000), _tenant("b", "team1", 4000),
         _tenant("c", "team2", 8000)],
        {},
        [_cohort("team1", "org", 8000), _cohort("team2", "org", 8000, weight=3.0),
         _cohort("org", None, 16000)],
        {"a": 2.0},
    )


def test_a_tenant_borrows_from_its_sibling_before_its_aunt() -> None:
    book = _org()
    assert book.refuse("a", "std", (10000, 0, 0)) is None
    book.add("a", "std", (10000, 0, 0))
    a = book.tenant_node("a", "std")
    team1 = book.cohort_node("team1", "std")
    assert a is not None and team1 is not None
    # a borrows 6000m: 4000m that b lends within team1, 2000m from team2 through org. team1
    # lends all its cap up to org, so what it can make available is org's 16000m.
    assert a.borrowed == (6000, 0, 0) and a.parent_lendable == (16000, 0, 0)
    assert team1.borrowed == (2000, 0, 0) and team1.parent_lendable == (16000, 0, 0)
    assert a.path == ("team1", "org") and team1.path == ("org",)
    assert a.share == pytest.approx(6000 / 16000 / 2.0)
    assert team1.share == pytest.approx(2000 / 16000)


def test_a_teams_guarantee_holds_against_another_teams_burst() -> None:
    book = _org()
    book.add("c", "std", (14000, 0, 0))
    # team2 took everything team1 lends; team1's tenants still get their nominal.
    assert book.refuse("a", "std", (4000, 0, 0)) is None
    book.add("a", "std", (4000, 0, 0))
    book.add("b", "std", (1000, 0, 0))
    # a borrows b's unused nominal within team1...
    assert book.refuse("a", "std", (1000, 0, 0)) is None
    book.add("a", "std", (1000, 0, 0))
    # ...but nothing beyond: org has nothing left to lend.
    refused = book.refuse("a", "std", (4000, 0, 0))
    assert refused is not None and refused.code == Reason.QUOTA_BORROW_UNAVAILABLE
    assert refused.message == (
        "needs 4000m cpu; a uses 5000m of 4000m nominal, cohort org on its path can lend "
        "0m now")


def test_every_levels_limit_refuses_naming_the_level() -> None:
    book = QuotaBook(
        [_tenant("a", "team1", 1000), _tenant("b", "team1", 1000)], {},
        [_cohort("team1", "org", 2000, lim=2500), _cohort("org", None, 10000)],
    )
    assert book.refuse("a", "std", (2500, 0, 0)) is None
    refused = book.refuse("a", "std", (2501, 0, 0))
    assert refused is not None and refused.code == Reason.QUOTA_BORROW_UNAVAILABLE
    assert refused.message.endswith("its cohort can lend 1500m now")
