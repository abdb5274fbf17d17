"""QuotaBook, the quota stage of the pipeline: what it admits, what it refuses with which
numbers, and how a pass's own placements move what a cohort can still lend."""

from __future__ import annotations

from app.scheduling.plugins.quota import QuotaBook, QuotaRow
from app.scheduling.reasons import Reason


def _book(*rows: QuotaRow, cohorts: dict[str, str] | None = None) -> QuotaBook:
    return QuotaBook(rows, cohorts or {})


def _cpu(tenant: str, nominal: int, cap: int | None = None, lend: int | None = None,
         used: int = 0, cohort: str = "c") -> QuotaRow:
    return QuotaRow(tenant, "std", "cpuMillis", cohort, nominal, cap, lend, used)


def test_a_class_no_quota_names_is_not_looked_at() -> None:
    book = _book(_cpu("a", 1000))
    assert not book.managed("other")
    assert book.refuse("a", "other", (10**9, 0, 0)) is None
    book.add("a", "other", (10**9, 0, 0))
    assert book.refuse("a", "std", (1000, 0, 0)) is None


def test_borrowing_is_bounded_by_the_cap_and_by_what_the_cohort_lends() -> None:
    book = _book(_cpu("a", 4000, lend=3000), _cpu("b", 2000, cap=2500), _cpu("d", 0))
    # Within nominal: admitted; memory is not managed in the class.
    assert book.refuse("b", "std", (2000, 10**9, 0)) is None
    over = book.refuse("b", "std", (3000, 0, 0))
    assert over is not None and over.code == Reason.QUOTA_EXCEEDED
    assert over.message == "needs 3000m cpu; b uses 0m of 2000m nominal and may borrow at most 500m"
    # d (nominal 0) borrows from a (3000 of its 4000 lent) and b (its unused 2000).
    assert book.refuse("d", "std", (5000, 0, 0)) is None
    book.add("d", "std", (4500, 0, 0))
    refused = book.refuse("d", "std", (1000, 0, 0))
    assert refused is not None and refused.code == Reason.QUOTA_BORROW_UNAVAILABLE
    assert refused.message == (
        "needs 1000m cpu; d uses 4500m of 0m nominal, its cohort can lend 500m now")
    # b's own nominal is still b's, although lent out; once b uses it, nothing is left.
    assert book.refuse("b", "std", (2000, 0, 0)) is None
    book.add("b", "std", (1600, 0, 0))
    refused = book.refuse("d", "std", (1, 0, 0))
    assert refused is not None and refused.message.endswith("its cohort can lend 0m now")


def test_a_tenant_without_a_row_has_nominal_zero_in_its_own_cohort() -> None:
    book = _book(_cpu("a", 1000), _cpu("x", 1000, cohort="other"),
                 cohorts={"new": "other"})
    assert book.refuse("new", "std", (1000, 0, 0)) is None  # x lends its 1000
    book.add("new", "std", (1000, 0, 0))
    refused = book.refuse("new", "std", (1, 0, 0))
    assert refused is not None and refused.code == Reason.QUOTA_BORROW_UNAVAILABLE
    # a's cohort is untouched by what "other" lent.
    assert _book(_cpu("a", 1000), _cpu("b", 0)).refuse("b", "std", (1000, 0, 0)) is None


def test_usage_read_from_the_ledger_counts() -> None:
    book = _book(_cpu("a", 2000, used=1500), _cpu("b", 0, used=500))
    # a lends its unused 500, and b borrows it already.
    refused = book.refuse("b", "std", (1, 0, 0))
    assert refused is not None and refused.code == Reason.QUOTA_BORROW_UNAVAILABLE
    assert book.refuse("a", "std", (500, 0, 0)) is None
