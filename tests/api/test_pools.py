"""Pools through the HTTP API: create, read, visibility, pagination, edit, delete, capacity."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from app import metrics as berth_metrics
from app.db import Database
from app.ledger.keys import api_key_create
from tests.api.conftest import TENANT_A, TENANT_B, Keys, PoolMaker, assert_problem, pool_body
from tests.api.ledger_state import heartbeat_at, lease_end, lease_hold

# --- create -------------------------------------------------------------------------------


async def test_create_pool_answers_201_with_location_etag_and_the_pool(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post("/v1/pools", json=pool_body("pool-x"), headers=keys.admin)

    assert response.status_code == 201, response.text
    assert response.headers["location"] == "/v1/pools/pool-x"
    assert response.headers["etag"] == '"1"'
    pool = response.json()
    assert pool["id"] == "pool-x"
    assert pool["tenantIds"] == [TENANT_A]
    assert pool["runtimeClass"] == "gpu-small"
    assert pool["runtimeInstanceId"] == "rt-1"
    assert pool["labels"] == {"tier": "standard"}
    assert pool["operators"] == ["operator-x"]
    assert pool["status"] == "ACTIVE" and pool["ready"] is True
    assert pool["capacity"] is None and pool["reserved"] is None and pool["available"] is None
    assert pool["healthy"] is False, "no ledger and no heartbeat: fail closed"
    assert pool["lastHeartbeatAt"] is None
    assert pool["activeLeases"] == 0
    assert pool["drainProgress"] is None
    assert pool["version"] == 1 and pool["etag"] == '"1"'


async def test_create_pool_twice_is_409(client: httpx.AsyncClient, keys: Keys) -> None:
    first = await client.post("/v1/pools", json=pool_body("pool-x"), headers=keys.admin)
    assert first.status_code == 201
    again = await client.post(
        "/v1/pools", json=pool_body("pool-x", region="us-east"), headers=keys.admin
    )
    body = assert_problem(again, 409)
    assert "pool-x" in body["detail"]


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        pytest.param({"id": "Pool_X"}, "id", id="id-not-a-slug"),
        pytest.param({"id": "-pool"}, "id", id="id-leading-dash"),
        pytest.param({"id": "a" * 64}, "id", id="id-too-long"),
        pytest.param({"costWeight": -0.5}, "costWeight", id="negative-cost-weight"),
        pytest.param({"runtimeClass": "GPU small"}, "runtimeClass", id="bad-runtime-class"),
        pytest.param({"surprise": 1}, "surprise", id="unknown-field"),
        pytest.param({"labels": {"tier": 3}}, "labels", id="label-not-a-string"),
        pytest.param({"tenantIds": "tenant-a"}, "tenantIds", id="tenant-ids-not-a-list"),
    ],
)
async def test_create_pool_with_bad_fields_is_422(
    client: httpx.AsyncClient, keys: Keys, fields: dict, where: str
) -> None:
    body = pool_body("pool-x", **fields)
    response = await client.post("/v1/pools", json=body, headers=keys.admin)

    body = assert_problem(response, 422)
    assert any(where in [str(p) for p in e["loc"]] for e in body["errors"]), body


async def test_create_pool_without_required_fields_is_422(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post("/v1/pools", json={"id": "pool-x"}, headers=keys.admin)

    body = assert_problem(response, 422)
    missing = {e["loc"][-1] for e in body["errors"]}
    assert {"runtimeClass", "runtimeInstanceId", "region"} <= missing


async def test_create_pool_with_malformed_json_is_400(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        "/v1/pools",
        content=b'{"id": "pool-x",',
        headers={**keys.admin, "Content-Type": "application/json"},
    )
    assert_problem(response, 400)  # not JSON at all


@pytest.mark.parametrize("role", ["tenant_a", "operator_x", "runtime_1"])
async def test_create_pool_needs_admin(
    client: httpx.AsyncClient, keys: Keys, role: str
) -> None:
    response = await client.post("/v1/pools", json=pool_body("pool-x"), headers=keys[role])
    assert_problem(response, 403)


# --- read and visibility --------------------------------------------------------------------


async def test_get_pool_returns_it_with_etag(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")

    response = await client.get("/v1/pools/pool-x", headers=keys.tenant_a)

    assert response.status_code == 200
    assert response.headers["etag"] == response.json()["etag"]
    assert response.json()["capacity"] == {"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 4}


async def test_tenant_never_sees_a_pool_not_listing_it(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-a", tenant_ids=[TENANT_A])
    await pool_make("pool-b", tenant_ids=[TENANT_B])

    listed = await client.get("/v1/pools", headers=keys.tenant_a)
    hidden = await client.get("/v1/pools/pool-b", headers=keys.tenant_a)
    unknown = await client.get("/v1/pools/pool-nope", headers=keys.tenant_a)

    assert [p["id"] for p in listed.json()["items"]] == ["pool-a"]
    body = assert_problem(hidden, 404)
    assert body["detail"] == assert_problem(unknown, 404)["detail"], "404s must look alike"


async def test_shared_pool_shows_a_tenant_only_its_own_tenant_id(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-shared", tenant_ids=[TENANT_A, TENANT_B])

    as_a = await client.get("/v1/pools/pool-shared", headers=keys.tenant_a)
    as_admin = await client.get("/v1/pools/pool-shared", headers=keys.admin)
    as_operator = await client.get("/v1/pools/pool-shared", headers=keys.operator_x)

    assert as_a.json()["tenantIds"] == [TENANT_A]
    assert as_admin.json()["tenantIds"] == [TENANT_A, TENANT_B]
    assert as_operator.json()["tenantIds"] == [TENANT_A, TENANT_B], "it operates the pool"


async def test_create_pool_drops_repeated_list_entries(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    body = pool_body("pool-x", tenantIds=[TENANT_B, TENANT_A, TENANT_B], operators=["o", "o"])
    response = await client.post("/v1/pools", json=body, headers=keys.admin)
    assert response.json()["tenantIds"] == [TENANT_B, TENANT_A]
    assert response.json()["operators"] == ["o"]


async def test_each_role_lists_exactly_the_pools_it_may_see(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-a", tenant_ids=[TENANT_A], operators=["operator-x"])
    await pool_make("pool-b", tenant_ids=[TENANT_B], operators=["operator-y"],
                    runtimeInstanceId="rt-2")
    await pool_make("pool-c", tenant_ids=["tenant-c"], operators=[], runtimeInstanceId="rt-3")
    async with db.transaction() as conn:
        ops_key = await api_key_create(
            conn, role="operator", subject="ops-c", tenant_ids=["tenant-c"]
        )

    async def ids(headers: dict[str, str]) -> list[str]:
        response = await client.get("/v1/pools", headers=headers)
        assert response.status_code == 200, response.text
        return [p["id"] for p in response.json()["items"]]

    assert await ids(keys.admin) == ["pool-a", "pool-b", "pool-c"]
    assert await ids(keys.tenant_a) == ["pool-a"]
    assert await ids(keys.tenant_b) == ["pool-b"]
    assert await ids(keys.operator_x) == ["pool-a"]
    assert await ids(keys.operator_y) == ["pool-b"]
    assert await ids({"Authorization": f"Bearer {ops_key}"}) == ["pool-c"], "via its tenants"
    assert await ids(keys.runtime_1) == ["pool-a"]
    assert await ids(keys.runtime_2) == ["pool-b"]


async def test_list_pages_through_pools_in_stable_id_order(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    names = [f"pool-{i}" for i in (5, 2, 7, 1, 4, 6, 3)]
    for name in names:
        await pool_make(name, register_capacity=False)

    pages, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        response = await client.get("/v1/pools", params=params, headers=keys.tenant_a)
        assert response.status_code == 200, response.text
        page = response.json()
        pages.append([p["id"] for p in page["items"]])
        cursor = page["nextCursor"]
        if cursor is None:
            break

    assert [len(p) for p in pages] == [3, 3, 1]
    assert sum(pages, []) == sorted(names)


async def test_list_filters_by_status_and_runtime_class(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-1", runtimeClass="cpu-std")
    await pool_make("pool-2", runtimeClass="gpu-small")
    await pool_make("pool-3", runtimeClass="gpu-small")
    cordon = await client.post("/v1/pools/pool-3/cordon", headers=keys.admin)
    assert cordon.status_code == 200

    by_class = await client.get(
        "/v1/pools", params={"runtimeClass": "gpu-small"}, headers=keys.admin
    )
    by_status = await client.get("/v1/pools", params={"status": "CORDONED"}, headers=keys.admin)
    both = await client.get(
        "/v1/pools", params={"status": "ACTIVE", "runtimeClass": "gpu-small"}, headers=keys.admin
    )

    assert [p["id"] for p in by_class.json()["items"]] == ["pool-2", "pool-3"]
    assert [p["id"] for p in by_status.json()["items"]] == ["pool-3"]
    assert [p["id"] for p in both.json()["items"]] == ["pool-2"]


@pytest.mark.parametrize(
    ("params", "status"),
    [
        pytest.param({"limit": 0}, 422, id="limit-zero"),
        pytest.param({"limit": 501}, 422, id="limit-too-big"),
        pytest.param({"status": "SLEEPING"}, 422, id="unknown-status"),
        pytest.param({"cursor": "not-a-cursor!"}, 400, id="garbage-cursor"),
        pytest.param({"cursor": "MTIz"}, 400, id="cursor-of-a-number"),
    ],
)
async def test_list_rejects_bad_parameters(
    client: httpx.AsyncClient, keys: Keys, params: dict, status: int
) -> None:
    response = await client.get("/v1/pools", params=params, headers=keys.admin)
    assert_problem(response, status)


async def test_pool_health_needs_ready_fresh_heartbeat_and_ledger(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-fresh", runtimeInstanceId="rt-fresh")
    await pool_make("pool-stale", runtimeInstanceId="rt-stale")
    await pool_make("pool-nocap", runtimeInstanceId="rt-fresh", register_capacity=False)
    await pool_make("pool-unready", runtimeInstanceId="rt-fresh", ready=False)
    await pool_make("pool-silent", runtimeInstanceId="rt-silent")
    now = datetime.now(UTC)
    await heartbeat_at(db, instance_id="rt-fresh", at=now)
    await heartbeat_at(db, instance_id="rt-stale", at=now - timedelta(minutes=10))

    response = await client.get("/v1/pools", headers=keys.admin)

    health = {p["id"]: p["healthy"] for p in response.json()["items"]}
    assert health == {
        "pool-fresh": True,
        "pool-nocap": False,
        "pool-silent": False,
        "pool-stale": False,
        "pool-unready": False,
    }
    beats = {p["id"]: p["lastHeartbeatAt"] for p in response.json()["items"]}
    assert beats["pool-silent"] is None and beats["pool-fresh"] is not None


# --- edit -----------------------------------------------------------------------------------


async def test_patch_merges_fields_and_bumps_the_version(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", labels={"tier": "standard", "gpu": "a100"})
    before = await client.get("/v1/pools/pool-x", headers=keys.admin)

    response = await client.patch(
        "/v1/pools/pool-x",
        json={"labels": {"gpu": None, "zone": "b"}, "costWeight": 2.5, "ready": False},
        headers={**keys.admin, "If-Match": before.headers["etag"]},
    )

    assert response.status_code == 200, response.text
    pool = response.json()
    assert pool["labels"] == {"tier": "standard", "zone": "b"}
    assert pool["costWeight"] == 2.5 and pool["ready"] is False
    assert pool["region"] == "eu-west", "absent fields stay"
    assert pool["version"] == before.json()["version"] + 1
    assert response.headers["etag"] == pool["etag"] != before.headers["etag"]


async def test_patch_accepts_merge_patch_content_type(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    response = await client.patch(
        "/v1/pools/pool-x",
        content=b'{"region": "us-east"}',
        headers={**keys.admin, "Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["region"] == "us-east"


async def test_patch_with_a_stale_etag_is_412_and_changes_nothing(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    stale = (await client.get("/v1/pools/pool-x", headers=keys.admin)).headers["etag"]
    first = await client.patch(
        "/v1/pools/pool-x", json={"region": "us-east"}, headers={**keys.admin, "If-Match": stale}
    )
    assert first.status_code == 200

    second = await client.patch(
        "/v1/pools/pool-x", json={"region": "ap-south"}, headers={**keys.admin, "If-Match": stale}
    )

    assert_problem(second, 412)
    after = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert after.json()["region"] == "us-east"


async def test_concurrent_patches_with_the_same_etag_one_wins_one_is_412(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    etag = (await client.get("/v1/pools/pool-x", headers=keys.admin)).headers["etag"]

    responses = await asyncio.gather(
        *(
            client.patch(
                "/v1/pools/pool-x",
                json={"region": region},
                headers={**keys.admin, "If-Match": etag},
            )
            for region in ("us-east", "ap-south")
        )
    )

    assert sorted(r.status_code for r in responses) == [200, 412]
    winner = next(r for r in responses if r.status_code == 200)
    after = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert after.json()["region"] == winner.json()["region"]
    assert after.json()["version"] == winner.json()["version"] == int(etag.strip('"')) + 1


async def test_patch_if_match_star_and_unknown_pool(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    star = await client.patch(
        "/v1/pools/pool-x", json={"region": "us-east"}, headers={**keys.admin, "If-Match": "*"}
    )
    missing = await client.patch("/v1/pools/pool-nope", json={"region": "x"}, headers=keys.admin)
    missing_matched = await client.patch(
        "/v1/pools/pool-nope", json={"region": "x"}, headers={**keys.admin, "If-Match": '"1"'}
    )

    assert star.status_code == 200
    assert_problem(missing, 404)
    assert_problem(missing_matched, 404)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"region": None}, id="null-field"),
        pytest.param({"id": "pool-y"}, id="id-is-not-patchable"),
        pytest.param({"status": "CORDONED"}, id="status-is-not-patchable"),
        pytest.param({"costWeight": -1}, id="negative-cost-weight"),
    ],
)
async def test_patch_with_bad_fields_is_422(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, body: dict
) -> None:
    await pool_make("pool-x")
    response = await client.patch("/v1/pools/pool-x", json=body, headers=keys.admin)
    assert_problem(response, 422)


async def test_patch_beyond_the_label_limit_is_422_and_changes_nothing(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", labels={f"k{i}": "v" for i in range(30)})
    response = await client.patch(
        "/v1/pools/pool-x", json={"labels": {f"n{i}": "v" for i in range(3)}}, headers=keys.admin
    )
    assert_problem(response, 422)
    after = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert len(after.json()["labels"]) == 30


async def test_patch_needs_admin(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    for role in ("tenant_a", "operator_x"):
        response = await client.patch("/v1/pools/pool-x", json={"ready": False}, headers=keys[role])
        assert_problem(response, 403)


async def test_empty_patch_changes_nothing(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    created = await pool_make("pool-x")
    response = await client.patch("/v1/pools/pool-x", json={}, headers=keys.admin)
    assert response.status_code == 200
    assert response.json()["version"] == created["version"]


# --- delete ---------------------------------------------------------------------------------


async def test_delete_pool_answers_204_and_it_is_gone(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    ended = await lease_hold(db, pool_id="pool-x", amounts=(100, 100, 0))
    await lease_end(db, lease=ended)

    response = await client.delete("/v1/pools/pool-x", headers=keys.admin)

    assert response.status_code == 204 and response.content == b""
    assert_problem(await client.get("/v1/pools/pool-x", headers=keys.admin), 404)
    assert_problem(await client.delete("/v1/pools/pool-x", headers=keys.admin), 404)


async def test_delete_pool_with_a_live_lease_is_409(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    await lease_hold(db, pool_id="pool-x", amounts=(100, 100, 0))

    response = await client.delete("/v1/pools/pool-x", headers=keys.admin)

    assert "1 live lease" in assert_problem(response, 409)["detail"]
    assert (await client.get("/v1/pools/pool-x", headers=keys.admin)).status_code == 200


async def test_delete_pool_needs_admin(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    assert_problem(await client.delete("/v1/pools/pool-x", headers=keys.operator_x), 403)
    assert_problem(await client.delete("/v1/pools/pool-x", headers=keys.tenant_a), 403)


# --- capacity -------------------------------------------------------------------------------


async def test_capacity_put_registers_then_changes_totals(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x", register_capacity=False)

    first = await client.put(
        "/v1/pools/pool-x/capacity",
        json={"cpuMillis": 2000, "memoryMiB": 4096, "llmSlots": 2},
        headers=keys.admin,
    )
    await lease_hold(db, pool_id="pool-x", amounts=(500, 1024, 1))
    second = await client.put(
        "/v1/pools/pool-x/capacity",
        json={"cpuMillis": 1000, "memoryMiB": 8192, "llmSlots": 1},
        headers=keys.admin,
    )

    assert first.status_code == 200, first.text
    assert first.json()["capacity"] == {"cpuMillis": 2000, "memoryMiB": 4096, "llmSlots": 2}
    assert first.json()["reserved"] == {"cpuMillis": 0, "memoryMiB": 0, "llmSlots": 0}
    assert second.status_code == 200, second.text
    pool = second.json()
    assert pool["capacity"] == {"cpuMillis": 1000, "memoryMiB": 8192, "llmSlots": 1}
    assert pool["reserved"] == {"cpuMillis": 500, "memoryMiB": 1024, "llmSlots": 1}
    assert pool["available"] == {"cpuMillis": 500, "memoryMiB": 7168, "llmSlots": 0}
    assert pool["activeLeases"] == 1
    assert second.headers["etag"] == pool["etag"]


@pytest.mark.parametrize(
    ("totals", "message"),
    [
        pytest.param((500, 8192, 4), "cpuMillis total 500 is below the 800 reserved now", id="cpu"),
        pytest.param(
            (4000, 1000, 4), "memoryMiB total 1000 is below the 2048 reserved now", id="memory"
        ),
        pytest.param((4000, 8192, 0), "llmSlots total 0 is below the 1 reserved now", id="llm"),
    ],
)
async def test_capacity_below_reserved_is_409_naming_the_dimension(
    client: httpx.AsyncClient,
    keys: Keys,
    pool_make: PoolMaker,
    db: Database,
    totals: tuple[int, int, int],
    message: str,
) -> None:
    await pool_make("pool-x")
    await lease_hold(db, pool_id="pool-x", amounts=(800, 2048, 1))
    cpu, memory, llm = totals

    response = await client.put(
        "/v1/pools/pool-x/capacity",
        json={"cpuMillis": cpu, "memoryMiB": memory, "llmSlots": llm},
        headers=keys.admin,
    )

    body = assert_problem(response, 409)
    assert body["detail"] == message
    after = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert after.json()["capacity"] == {"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 4}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"cpuMillis": -1, "memoryMiB": 0, "llmSlots": 0}, id="negative"),
        pytest.param({"cpuMillis": 1, "memoryMiB": 1}, id="missing-dimension"),
        pytest.param({"cpuMillis": 1.5, "memoryMiB": 1, "llmSlots": 0}, id="fractional"),
        pytest.param({"cpuMillis": 1, "memoryMiB": 1, "llmSlots": 0, "gpus": 1}, id="unknown"),
    ],
)
async def test_capacity_with_bad_totals_is_422(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, body: dict
) -> None:
    await pool_make("pool-x", register_capacity=False)
    response = await client.put("/v1/pools/pool-x/capacity", json=body, headers=keys.admin)
    assert_problem(response, 422)


async def test_capacity_of_unknown_pool_is_404_and_needs_admin(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", register_capacity=False)
    totals = {"cpuMillis": 1, "memoryMiB": 1, "llmSlots": 1}
    missing = await client.put("/v1/pools/pool-nope/capacity", json=totals, headers=keys.admin)
    as_operator = await client.put(
        "/v1/pools/pool-x/capacity", json=totals, headers=keys.operator_x
    )
    assert_problem(missing, 404)
    assert_problem(as_operator, 403)


async def test_metrics_never_carry_pool_ids(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-secret-name")
    assert (await client.get("/v1/pools/pool-secret-name", headers=keys.admin)).status_code == 200

    metrics = await client.get("/metrics")

    assert metrics.status_code == 200
    assert "/v1/pools/{poolId}" in metrics.text
    assert "pool-secret-name" not in metrics.text
    assert berth_metrics.PLACEMENTS._name in metrics.text, "Berth's own metrics are served too"
