"""Quota charges in the ledger: a borrowing (tenant, class) raises its cohort's rows for all
of its resources or for none, and a refused one leaves every row as it found it."""

from __future__ import annotations

from datetime import UTC, datetime

from app.db import Database
from app.ledger.cohorts import cohort_put
from app.ledger.invariants import ledger_check
from app.ledger.quotas import (
    QuotaRead,
    quota_charge,
    quota_read,
    quota_rows_read,
    quota_tree_read,
)
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


async def test_one_quota_read_gives_what_the_rows_and_the_tree_read_give(db: Database) -> None:
    """``quota_read`` (the previews' one read) returns the quota rows, the tree, and the
    tenants' cohorts and weights exactly as the two reads of a pass do."""
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await cohort_put(conn, cohort_id="root", parent=None, fair_weight=1.0, now=now,
                         quotas={"standard": {"cpuMillis": Quota(8000)}})
        await cohort_put(conn, cohort_id="c", parent="root", fair_weight=2.0, now=now,
                         quotas={})
        await tenant_put(conn, tenant_id="a", cohort="c", fair_weight=3.0, now=now,
                         quotas={"standard": {"cpuMillis": Quota(3000)}})
        await tenant_put(conn, tenant_id="b", cohort="root", fair_weight=1.0, now=now,
                         quotas={"gpu": {"llmSlots": Quota(2)}})
        for classes, tenants in ((["standard"], ["a", "b", "nobody"]), (["gpu"], ["b"]),
                                 (["standard", "gpu"], ["a"]), (["unmanaged"], ["a"])):
            rows, cohorts = await quota_rows_read(conn, runtime_classes=classes,
                                                  tenant_ids=tenants)
            tree, weights, of = await quota_tree_read(conn, runtime_classes=classes,
                                                      tenant_ids=tenants)
            read = await quota_read(conn, runtime_classes=classes, tenant_ids=tenants)
            assert read == QuotaRead(tuple(rows), {**of, **cohorts}, tuple(tree), weights)
        assert read == QuotaRead()
        assert (await quota_read(conn, runtime_classes=["standard"], tenant_ids=["a"])).tree
