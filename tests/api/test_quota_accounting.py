"""Quota accounting under admin changes and races: a lease's usage goes back to the class it
was charged in, whatever happens to its pool meanwhile; concurrent PUTs of one tenant leave
the last one's quotas whole, and the usage rows say so."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from app.ledger.invariants import ledger_check
from app.ledger.tenants import Quota, tenant_put
from tests.api.conftest import TENANT_A, TENANT_B
from tests.api.test_quota_admission import set_tenant, shared, sound, submit

__all__ = ["shared"]  # the fixture, used by name


async def test_a_lease_returns_to_the_class_it_was_charged_in(
    client, keys, shared, pool_make, reconcile, db
):
    await set_tenant(client, keys, TENANT_A, "c", nominal=1000)
    await set_tenant(client, keys, TENANT_B, "c", nominal=4000)
    # The other class is managed too, and tenant-a has a usage row there (nothing used).
    body = {"cohort": "c", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 1000}},
                                      "gpu-large": {"cpuMillis": {"nominal": 500}}}}
    assert (await client.put(f"/v1/tenants/{TENANT_A}", json=body,
                             headers=keys.admin)).status_code == 200
    ids = await submit(client, keys, "tenant_a", 2, cpu=1000)  # one borrowed from b
    await reconcile()
    r = await client.patch("/v1/pools/pool-x", json={"runtimeClass": "gpu-large"},
                           headers=keys.admin)
    assert r.status_code == 200, r.text

    for task_id in ids:
        r = await client.post(f"/v1/tasks/{task_id}/cancel", headers=keys.tenant_a)
        assert r.status_code == 200, r.text
    await sound(db)


async def _blocked(db, pid: int) -> bool:
    async with db.connection() as conn:
        return bool(await conn.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid))


async def test_concurrent_puts_of_one_tenant_leave_the_last_write(db):
    now = datetime.now(UTC)
    quota = {"standard": {"cpuMillis": Quota(1121)}}
    async with db.connection() as first, db.connection() as second:
        tx = first.transaction()
        await tx.start()
        await tenant_put(first, tenant_id="t", cohort="c", fair_weight=1.0, quotas=quota, now=now)
        pid = await second.fetchval("SELECT pg_backend_pid()")

        async def clear() -> None:
            async with second.transaction():
                await tenant_put(second, tenant_id="t", cohort="c", fair_weight=1.0, quotas={},
                                 now=now)

        later = asyncio.create_task(clear())
        for _ in range(500):
            if await _blocked(db, pid):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the second PUT never waited for the first")
        await tx.commit()
        await later
    async with db.connection() as conn:
        assert await conn.fetch("SELECT * FROM tenant_quotas") == []
        assert await conn.fetch("SELECT * FROM quota_usage") == []
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}


async def test_the_invariant_check_sees_a_usage_row_without_its_quota(db):
    async with db.transaction() as conn:
        await tenant_put(conn, tenant_id="t", cohort="c", fair_weight=1.0, now=datetime.now(UTC),
                         quotas={"standard": {"cpuMillis": Quota(1121, 10, None)}})
        await conn.execute("UPDATE tenant_quotas SET nominal = 1000")
        assert (await ledger_check(conn))["quota_usage_not_its_quota"] == 1
        await conn.execute("DELETE FROM tenant_quotas")
        assert (await ledger_check(conn))["quota_usage_not_its_quota"] == 1
