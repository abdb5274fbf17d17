"""Usage on a shared pool: a tenant sees its own reservations and leases and the pool's free
capacity, never another tenant's numbers; admins, the pool's operators and its runtime see
the totals."""

from __future__ import annotations

import httpx

from app.db import Database
from app.ledger.keys import api_key_create
from tests.api.conftest import TENANT_A, TENANT_B, Keys, PoolMaker, assert_problem
from tests.api.ledger_state import lease_hold

CAPACITY = {"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 4}


def cpu(usage: dict) -> int:
    return usage["cpuMillis"]


async def shared_pool(db: Database, pool_make: PoolMaker) -> None:
    """pool-x shared by tenant-a (two leases, 1200 m) and tenant-b (one lease, 1000 m)."""
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B], capacity=CAPACITY)
    await lease_hold(db, pool_id="pool-x", amounts=(800, 1024, 1), tenant_id=TENANT_A)
    await lease_hold(db, pool_id="pool-x", amounts=(400, 512, 0), tenant_id=TENANT_A)
    await lease_hold(db, pool_id="pool-x", amounts=(1000, 2048, 2), tenant_id=TENANT_B)


async def views(client: httpx.AsyncClient, headers: dict[str, str]) -> list[dict]:
    """Return the pool as getPool and as listPools show it to ``headers``."""
    one = await client.get("/v1/pools/pool-x", headers=headers)
    assert one.status_code == 200, one.text
    listed = await client.get("/v1/pools", headers=headers)
    (item,) = [p for p in listed.json()["items"] if p["id"] == "pool-x"]
    return [one.json(), item]


async def test_each_tenant_sees_its_own_usage_and_the_free_capacity(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await shared_pool(db, pool_make)
    free = {"cpuMillis": 1800, "memoryMiB": 4608, "llmSlots": 1}
    for who, reserved, leases in (
        ("tenant_a", {"cpuMillis": 1200, "memoryMiB": 1536, "llmSlots": 1}, 2),
        ("tenant_b", {"cpuMillis": 1000, "memoryMiB": 2048, "llmSlots": 2}, 1),
    ):
        for pool in await views(client, keys[who]):
            assert pool["usageScope"] == "own", who
            assert pool["reserved"] == reserved, who
            assert pool["activeLeases"] == leases, who
            assert pool["available"] == free, "every caller sees the pool's free capacity"
            assert pool["capacity"] == CAPACITY
            assert len(pool["tenantIds"]) == 1, "nor which other tenants share the pool"


async def test_admin_operators_and_the_runtime_see_the_totals(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await shared_pool(db, pool_make)
    for who in ("admin", "operator_x", "runtime_1"):
        for pool in await views(client, keys[who]):
            assert pool["usageScope"] == "pool", who
            assert cpu(pool["reserved"]) == 2200 and pool["activeLeases"] == 3, who
            assert cpu(pool["available"]) == 1800


async def test_an_operator_that_sees_the_pool_through_a_tenant_reads_that_tenants_share(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await shared_pool(db, pool_make)
    async with db.transaction() as conn:
        key = await api_key_create(conn, role="operator", subject="b-ops", tenant_ids=[TENANT_B])
    for pool in await views(client, {"Authorization": f"Bearer {key}"}):
        assert pool["usageScope"] == "own"
        assert cpu(pool["reserved"]) == 1000 and pool["activeLeases"] == 1
    assert_problem(await client.get("/v1/pools/pool-x", headers=keys.operator_y), 404)


async def test_drain_progress_counts_only_the_tenants_own_leases(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await shared_pool(db, pool_make)
    assert (await client.post("/v1/pools/pool-x/drain", headers=keys.admin)).status_code == 200
    admin = (await client.get("/v1/pools/pool-x", headers=keys.admin)).json()
    tenant_b = (await client.get("/v1/pools/pool-x", headers=keys.tenant_b)).json()
    assert admin["drainProgress"] == {"leasesLeft": 3}
    assert tenant_b["drainProgress"] == {"leasesLeft": 1}


async def test_a_tenant_with_nothing_on_the_pool_sees_zero(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B], capacity=CAPACITY)
    await lease_hold(db, pool_id="pool-x", amounts=(1000, 0, 0), tenant_id=TENANT_A)
    (pool, _) = await views(client, keys.tenant_b)
    assert pool["reserved"] == {"cpuMillis": 0, "memoryMiB": 0, "llmSlots": 0}
    assert pool["activeLeases"] == 0 and cpu(pool["available"]) == 3000
