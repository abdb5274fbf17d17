"""Quota charges in the ledger: a borrowing (tenant, class) raises its cohort's rows for all
of its resources or for none, and a refused one leaves every row as it found it."""

from __future__ import annotations

from datetime import UTC, datetime

from app.db import Database
from app.ledger.invariants import ledger_check
from app.ledger.quotas import quota_charge
from app.ledger.tenants import Quota, tenant_put


async def _rows(conn) -> tuple[list, list]:
    usage = [tuple(r) for r in await conn.fetch(
        "SELECT tenant_id, resource, used FROM quota_usage ORDER BY 1, 2")]
    cohort = [tuple(r) for r in await conn.fetch(
        "SELECT cohort, resource, used FROM cohort_usage ORDER BY 1, 2")]
    return usage, cohort


async def test_a_borrow_short_of_one_resource_raises_no_cohort_row(db: Database) -> None:
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        # The lender lends 3000m cpu but only 100 MiB.
        await tenant_put(conn, tenant_id="lender", cohort="c", fair_weight=1.0, now=now,
                         quotas={"standard": {"cpuMillis": Quota(3000),
                                              "memoryMiB": Quota(100)}})
        await tenant_put(conn, tenant_id="borrower", cohort="c", fair_weight=1.0, now=now,
                         quotas={})
        before = await _rows(conn)
        refused = await quota_charge(
            conn, amounts={("borrower", "standard", "cpuMillis"): 1000,
                           ("borrower", "standard", "memoryMiB"): 500}, exists=())
        assert refused == {("borrower", "standard")}
        assert await _rows(conn) == (
            sorted([*before[0], ("borrower", "cpuMillis", 0), ("borrower", "memoryMiB", 0)]),
            before[1])
        # Within what is lent, both rise together.
        refused = await quota_charge(
            conn, amounts={("borrower", "standard", "cpuMillis"): 1000,
                           ("borrower", "standard", "memoryMiB"): 100}, exists=())
        assert refused == set()
        assert (await _rows(conn))[1] == [("c", "cpuMillis", 1000), ("c", "memoryMiB", 100)]
        broken = {k: v for k, v in (await ledger_check(conn)).items() if v}
        # The charge has no lease behind it: only the usage-vs-leases check can disagree.
        assert set(broken) <= {"quota_usage_not_sum_of_leases"}
