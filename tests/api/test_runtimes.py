"""Runtime heartbeats and lease lists through the HTTP API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from app.db import Database
from tests.api.conftest import RUNTIME_1, RUNTIME_2, TENANT_B, Keys, PoolMaker, assert_problem
from tests.api.ledger_state import heartbeat_at, lease_hold


async def test_heartbeat_makes_the_pool_healthy(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", runtimeInstanceId=RUNTIME_1)
    before = await client.get("/v1/pools/pool-x", headers=keys.admin)

    response = await client.post(f"/v1/runtimes/{RUNTIME_1}/heartbeat", headers=keys.runtime_1)

    assert response.status_code == 200, response.text
    beat = response.json()
    assert beat["instanceId"] == RUNTIME_1
    assert beat["renewedLeases"] == 0
    assert beat["heartbeatFreshnessSeconds"] == 15.0
    at = datetime.fromisoformat(beat["lastHeartbeatAt"])
    assert datetime.fromisoformat(beat["leasesExpireAt"]) - at == timedelta(seconds=60)
    after = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert before.json()["healthy"] is False and before.json()["lastHeartbeatAt"] is None
    assert after.json()["healthy"] is True
    assert datetime.fromisoformat(after.json()["lastHeartbeatAt"]) == at


async def test_heartbeat_renews_the_instance_leases_only(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-1", runtimeInstanceId=RUNTIME_1)
    await pool_make("pool-2", runtimeInstanceId=RUNTIME_2)
    await lease_hold(db, pool_id="pool-1", amounts=(100, 0, 0), expires_in=timedelta(seconds=20))
    await lease_hold(db, pool_id="pool-1", amounts=(100, 0, 0), expires_in=timedelta(seconds=20))
    await lease_hold(
        db, pool_id="pool-2", amounts=(100, 0, 0), instance_id=RUNTIME_2,
        expires_in=timedelta(seconds=20),
    )
    before = await client.get(f"/v1/runtimes/{RUNTIME_2}/leases", headers=keys.runtime_2)

    beat = await client.post(f"/v1/runtimes/{RUNTIME_1}/heartbeat", headers=keys.runtime_1)
    mine = await client.get(f"/v1/runtimes/{RUNTIME_1}/leases", headers=keys.runtime_1)
    other = await client.get(f"/v1/runtimes/{RUNTIME_2}/leases", headers=keys.runtime_2)

    assert beat.json()["renewedLeases"] == 2
    expiry = beat.json()["leasesExpireAt"]
    assert [lease["expiresAt"] for lease in mine.json()["items"]] == [expiry, expiry]
    assert other.json()["items"][0]["expiresAt"] == before.json()["items"][0]["expiresAt"]


async def test_heartbeat_accepts_and_ignores_a_body(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        f"/v1/runtimes/{RUNTIME_1}/heartbeat", json={"anything": 1}, headers=keys.runtime_1
    )
    assert response.status_code == 200


async def test_runtime_cannot_heartbeat_another_instance(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-2", runtimeInstanceId=RUNTIME_2)

    response = await client.post(f"/v1/runtimes/{RUNTIME_2}/heartbeat", headers=keys.runtime_1)

    assert RUNTIME_2 in assert_problem(response, 403)["detail"]
    pool = await client.get("/v1/pools/pool-2", headers=keys.admin)
    assert pool.json()["lastHeartbeatAt"] is None


@pytest.mark.parametrize("role", ["admin", "tenant_a", "operator_x"])
async def test_only_runtime_keys_heartbeat_or_list_leases(
    client: httpx.AsyncClient, keys: Keys, role: str
) -> None:
    beat = await client.post(f"/v1/runtimes/{RUNTIME_1}/heartbeat", headers=keys[role])
    listed = await client.get(f"/v1/runtimes/{RUNTIME_1}/leases", headers=keys[role])
    assert_problem(beat, 403)
    assert_problem(listed, 403)


async def test_heartbeat_without_a_key_is_401(client: httpx.AsyncClient) -> None:
    assert_problem(await client.post(f"/v1/runtimes/{RUNTIME_1}/heartbeat"), 401)


async def test_runtime_lists_its_live_leases(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-1", runtimeInstanceId=RUNTIME_1)
    await pool_make("pool-2", runtimeInstanceId=RUNTIME_2, tenant_ids=[TENANT_B])
    held = await lease_hold(db, pool_id="pool-1", amounts=(250, 512, 1), epoch=2)
    await lease_hold(db, pool_id="pool-2", amounts=(100, 0, 0), instance_id=RUNTIME_2)

    response = await client.get(f"/v1/runtimes/{RUNTIME_1}/leases", headers=keys.runtime_1)
    denied = await client.get(f"/v1/runtimes/{RUNTIME_2}/leases", headers=keys.runtime_1)

    assert response.status_code == 200, response.text
    page = response.json()
    assert page["nextCursor"] is None
    assert len(page["items"]) == 1
    lease = page["items"][0]
    assert lease["id"] == str(held.id) and lease["taskId"] == str(held.task_id)
    assert lease["poolId"] == "pool-1" and lease["runtimeInstanceId"] == RUNTIME_1
    assert lease["epoch"] == 2 and lease["members"] == 1
    assert lease["requests"] == {"cpuMillis": 250, "memoryMiB": 512, "llmSlots": 1}
    assert lease["tenantId"] == "tenant-a" and lease["labels"] == {"app": "web"}
    assert_problem(denied, 403)


async def test_runtime_leases_page_in_grant_order(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-1", runtimeInstanceId=RUNTIME_1)
    held = [await lease_hold(db, pool_id="pool-1", amounts=(10, 0, 0)) for _ in range(5)]

    seen, sizes, cursor = [], [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        response = await client.get(
            f"/v1/runtimes/{RUNTIME_1}/leases", params=params, headers=keys.runtime_1
        )
        assert response.status_code == 200, response.text
        sizes.append(len(response.json()["items"]))
        seen += [lease["id"] for lease in response.json()["items"]]
        cursor = response.json()["nextCursor"]
        if cursor is None:
            break

    assert sizes == [2, 2, 1]
    assert seen == [str(h.id) for h in held]


@pytest.mark.parametrize("cursor", ["garbage!", "WyJ4Il0", "WyJub3QtYS1kYXRlIiwieCJd"])
async def test_runtime_leases_reject_a_bad_cursor(
    client: httpx.AsyncClient, keys: Keys, cursor: str
) -> None:
    response = await client.get(
        f"/v1/runtimes/{RUNTIME_1}/leases", params={"cursor": cursor}, headers=keys.runtime_1
    )
    assert_problem(response, 400)


async def test_stale_heartbeat_leaves_the_pool_unhealthy(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x", runtimeInstanceId=RUNTIME_1)
    await heartbeat_at(db, instance_id=RUNTIME_1, at=datetime.now(UTC) - timedelta(seconds=16))
    stale = await client.get("/v1/pools/pool-x", headers=keys.runtime_1)
    await client.post(f"/v1/runtimes/{RUNTIME_1}/heartbeat", headers=keys.runtime_1)
    fresh = await client.get("/v1/pools/pool-x", headers=keys.runtime_1)

    assert stale.json()["healthy"] is False
    assert fresh.json()["healthy"] is True
