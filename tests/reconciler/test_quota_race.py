"""Quota race: four reconcilers, each owning other shards (so other tenants), on their own
connection pools, place the tasks of borrowers of one cohort at once. After every pass of
any of them, no tenant is past its nominal plus borrowing limit and the cohort has lent no
more than its lenders lend; at the end exactly all of it is lent."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from app.db import Database
from app.ledger.invariants import ledger_check
from app.ledger.tenants import Quota, tenant_put
from app.reconciler import Reconciler, ReconcilerConfig
from app.shards import shard_of, shard_slots_static
from tests.factories import NOW, ledger_violations, pools_add, spec_make, tasks_add

pytestmark = pytest.mark.slow

COUNT = 4
#: Lenders place nothing: the cohort lends min(lendingLimit, nominal) of theirs, 7000m.
LENDERS = {"lender-a": (4000, 3000), "lender-b": (5000, None)}
LENDABLE = 3000 + 4000  # lender-b's lending limit is 4000 (see below)
#: Borrowers: nominal 0, and a borrowing limit (None: only the cohort limits them).
BORROW_LIMITS = [1500, None, 2500, None, 1200, None, 3000, None]


def _borrowers() -> list[str]:
    """Two borrowers per reconciler's shard set, so that every reconciler places some."""
    out: list[str] = []
    by_owner: dict[int, int] = {}
    i = 0
    while len(out) < len(BORROW_LIMITS):
        name = f"borrower-{i}"
        owner = next(k for k in range(COUNT) if shard_of(name) in shard_slots_static(k, COUNT))
        if by_owner.get(owner, 0) < 2:
            by_owner[owner] = by_owner.get(owner, 0) + 1
            out.append(name)
        i += 1
    return out


async def _limits_hold(db: Database, caps: dict[str, int | None]) -> None:
    async with db.connection() as conn:
        used = {r[0]: int(r[1]) for r in await conn.fetch(
            "SELECT t.tenant_id, sum(r.cpu) FROM reservations r JOIN tasks t "
            "ON t.id = r.task_id WHERE NOT r.hold GROUP BY 1")}
        broken = {k: v for k, v in (await ledger_check(conn)).items() if v}
    assert broken == {}
    for tenant, cap in caps.items():
        assert cap is None or used.get(tenant, 0) <= cap, (tenant, used)
    # The outsider (another cohort) runs on its own nominal, and lends nothing to c.
    assert sum(v for k, v in used.items() if k != "outsider") <= LENDABLE, used


async def test_four_reconcilers_never_exceed_a_quota_limit(
    db: Database, database_url: str
) -> None:
    borrowers = _borrowers()
    caps = dict(zip(borrowers, BORROW_LIMITS, strict=True))
    async with db.transaction() as conn:
        await pools_add(conn, 8, tenants=[*LENDERS, *borrowers, "outsider"],
                        capacity=(64_000, 64_000, 0))
        now = datetime.now(UTC)
        # lender-b lends all but 1000 of its nominal: its lending limit is 4000.
        for name, (nominal, lend) in LENDERS.items():
            lend = 4000 if name == "lender-b" else lend
            await tenant_put(conn, tenant_id=name, cohort="c", fair_weight=1.0, now=now,
                             quotas={"standard": {"cpuMillis": Quota(nominal, None, lend)}})
        for name, limit in caps.items():
            quotas = {} if limit is None else {
                "standard": {"cpuMillis": Quota(0, limit, None)}}
            await tenant_put(conn, tenant_id=name, cohort="c", fair_weight=1.0, now=now,
                             quotas=quotas)
        # An outsider of another cohort with a nominal of its own borrows nothing from c.
        await tenant_put(conn, tenant_id="outsider", cohort="other", fair_weight=1.0,
                         now=now, quotas={"standard": {"cpuMillis": Quota(500, None, None)}})
        for name in borrowers:
            await tasks_add(conn, tenant=name, count=60, spec=spec_make(cpu=100))
        await tasks_add(conn, tenant="outsider", count=20, spec=spec_make(cpu=100))
    caps["outsider"] = 500

    databases = [Database(database_url, max_size=3) for _ in range(COUNT)]
    checks = 0
    broken: list[BaseException] = []

    async def drain(reconciler: Reconciler) -> None:
        nonlocal checks
        idle = 0
        while idle < 2 and not broken:
            result = await reconciler.run_once(now=NOW)
            try:
                await _limits_hold(db, caps)  # after every pass
            except AssertionError as exc:
                broken.append(exc)  # the others stop too
                raise
            checks += 1
            idle = idle + 1 if result.claimed == 0 else 0

    try:
        reconcilers = [
            Reconciler(d, ReconcilerConfig(batch_size=25), owner_id=f"quota-racer-{i}",
                       slots=shard_slots_static(i, COUNT))
            for i, d in enumerate(databases)
        ]
        outcomes = await asyncio.gather(*(drain(r) for r in reconcilers),
                                        return_exceptions=True)
    finally:
        for d in databases:
            await d.close()

    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise errors[0]
    assert checks >= 4 * 3
    async with db.connection() as conn:
        used = {r[0]: int(r[1]) for r in await conn.fetch(
            "SELECT t.tenant_id, sum(r.cpu) FROM reservations r JOIN tasks t "
            "ON t.id = r.task_id GROUP BY 1")}
    # Demand (6000m per borrower) is far above what is lent: every lendable millicore is
    # taken, none more; the outsider used its own nominal only.
    assert sum(v for k, v in used.items() if k != "outsider") == LENDABLE
    assert used["outsider"] == 500
    assert await ledger_violations(db) == []
