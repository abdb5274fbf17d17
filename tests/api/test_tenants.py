"""Tenants through the API: admin writes, a tenant key reads only its own, bad quota bodies
are 422 with nothing stored, and usage is read from live leases."""

from __future__ import annotations

import pytest

from app.ledger.quotas import quota_charge
from tests.api.conftest import TENANT_A, TENANT_B, assert_problem
from tests.api.ledger_state import lease_hold

SETTINGS = {
    "cohort": "research",
    "fairWeight": 2,
    "quotas": {"gpu-small": {
        "cpuMillis": {"nominal": 2000, "borrowingLimit": 1000, "lendingLimit": 500},
        "llmSlots": {"nominal": 2},
    }},
}


async def put(client, keys, tenant: str, body: dict, who: str = "admin"):
    return await client.put(f"/v1/tenants/{tenant}", json=body, headers=keys[who])


async def test_admin_sets_a_tenant_and_reads_it_back(client, keys) -> None:
    r = await put(client, keys, TENANT_A, SETTINGS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == TENANT_A and body["cohort"] == "research" and body["fairWeight"] == 2
    assert body["quotas"] == {"gpu-small": {
        "cpuMillis": {"nominal": 2000, "borrowingLimit": 1000, "lendingLimit": 500},
        "llmSlots": {"nominal": 2, "borrowingLimit": None, "lendingLimit": None},
    }}
    assert body["updatedAt"].endswith("Z")
    got = await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.admin)
    assert got.json()["quotas"] == body["quotas"]
    # PUT replaces the whole: a quota left out is gone.
    r = await put(client, keys, TENANT_A, {"cohort": "research"})
    assert r.json()["quotas"] == {} and r.json()["fairWeight"] == 1
    listed = await client.get("/v1/tenants", headers=keys.admin)
    assert [t["id"] for t in listed.json()["items"]] == [TENANT_A]


async def test_an_unconfigured_tenant_reads_as_the_defaults(client, keys) -> None:
    r = await client.get(f"/v1/tenants/{TENANT_B}", headers=keys.tenant_b)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["cohort"], body["fairWeight"], body["quotas"], body["usage"]) == (
        "default", 1.0, {}, {})
    assert body["updatedAt"] is None


async def test_a_tenant_reads_only_its_own_and_writes_nothing(client, keys) -> None:
    assert (await put(client, keys, TENANT_B, SETTINGS)).status_code == 200
    other = await client.get(f"/v1/tenants/{TENANT_B}", headers=keys.tenant_a)
    assert_problem(other, 404)
    own = await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.tenant_a)
    assert own.status_code == 200
    listed = await client.get("/v1/tenants", headers=keys.tenant_a)
    assert [t["id"] for t in listed.json()["items"]] == [TENANT_A]
    assert_problem(await put(client, keys, TENANT_A, SETTINGS, who="tenant_a"), 403)
    for who in ("operator_x", "runtime_1"):
        assert_problem(await client.get("/v1/tenants", headers=keys[who]), 403)
        assert_problem(await client.get(f"/v1/tenants/{TENANT_A}", headers=keys[who]), 403)
    got = await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.admin)
    assert got.json()["updatedAt"] is None  # nothing stored by the refused write


@pytest.mark.parametrize("body", [
    {"fairWeight": 0},
    {"fairWeight": -1},
    {"fairWeight": "2"},
    {"fairWeight": True},
    {"cohort": ""},
    {"cohort": "a b"},
    {"quotas": {"gpu-small": {"cpuMillis": {"nominal": -1}}}},
    {"quotas": {"gpu-small": {"cpuMillis": {"nominal": "100"}}}},
    {"quotas": {"gpu-small": {"cpuMillis": {"nominal": 1.5}}}},
    {"quotas": {"gpu-small": {"cpuMillis": {}}}},
    {"quotas": {"gpu-small": {"cpuMillis": {"nominal": 100, "lendingLimit": 200}}}},
    {"quotas": {"gpu-small": {"cpuMillis": {"nominal": 100, "borrowingLimit": -5}}}},
    {"quotas": {"gpu-small": {"gpus": {"nominal": 1}}}},
    {"quotas": {"Not A Class": {"cpuMillis": {"nominal": 1}}}},
    {"quotas": []},
    {"tenantId": "x"},
], ids=["weight-0", "weight-negative", "weight-string", "weight-bool", "cohort-empty",
        "cohort-space", "nominal-negative", "nominal-string", "nominal-float", "nominal-missing",
        "lending-above-nominal", "borrowing-negative", "unknown-resource", "bad-class",
        "quotas-list", "unknown-field"])
async def test_bad_quota_bodies_are_422_and_store_nothing(client, keys, body) -> None:
    r = await put(client, keys, TENANT_A, body)
    problem = assert_problem(r, 422)
    assert problem["errors"], problem
    got = await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.admin)
    assert got.json()["updatedAt"] is None


async def test_usage_borrowed_and_borrowable_follow_the_live_leases(
    client, keys, pool_make, db
) -> None:
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B],
                    capacity={"cpuMillis": 16000, "memoryMiB": 8192, "llmSlots": 4})
    # Both in cohort c: a lends up to 1000 of its unused 4000; b has 2000 and no limit.
    a = {"cohort": "c", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 4000,
                                                               "lendingLimit": 1000}}}}
    b = {"cohort": "c", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 2000,
                                                               "borrowingLimit": 500}}}}
    assert (await put(client, keys, TENANT_A, a)).status_code == 200
    assert (await put(client, keys, TENANT_B, b)).status_code == 200
    await lease_hold(db, pool_id="pool-x", amounts=(1000, 0, 0), tenant_id=TENANT_A)
    await lease_hold(db, pool_id="pool-x", amounts=(2300, 0, 0), tenant_id=TENANT_B)

    usage_b = (await client.get(f"/v1/tenants/{TENANT_B}", headers=keys.tenant_b)).json()[
        "usage"]["gpu-small"]
    assert usage_b["used"] == {"cpuMillis": 2300, "memoryMiB": 0, "llmSlots": 0}
    assert usage_b["borrowed"]["cpuMillis"] == 300
    # a lends min(1000, 3000 unused) = 1000, 300 of it is borrowed: 700 left, but b's own
    # borrowing limit leaves it 200; memory and llm slots are not managed (null).
    assert usage_b["borrowable"] == {"cpuMillis": 200, "memoryMiB": None, "llmSlots": None}
    usage_a = (await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.tenant_a)).json()[
        "usage"]["gpu-small"]
    # b lends nothing (0 unused of its nominal), and already borrowed 300.
    assert usage_a["borrowed"]["cpuMillis"] == 0 and usage_a["borrowable"]["cpuMillis"] == 0


async def test_no_borrowing_across_cohorts_in_the_view(client, keys, pool_make, db) -> None:
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B],
                    capacity={"cpuMillis": 16000, "memoryMiB": 8192, "llmSlots": 4})
    a = {"cohort": "c1", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 4000}}}}
    b = {"cohort": "c2", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 2000}}}}
    await put(client, keys, TENANT_A, a)
    await put(client, keys, TENANT_B, b)
    usage_b = (await client.get(f"/v1/tenants/{TENANT_B}", headers=keys.tenant_b)).json()
    assert usage_b["usage"]["gpu-small"]["borrowable"]["cpuMillis"] == 0


async def test_share_is_the_dominant_borrowed_resource_over_weight(client, keys, db) -> None:
    lender = {"cohort": "c", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 8000}}}}
    a = {"cohort": "c", "fairWeight": 2,
         "quotas": {"gpu-small": {"cpuMillis": {"nominal": 1000}}}}
    assert (await put(client, keys, TENANT_B, lender)).status_code == 200
    assert (await put(client, keys, TENANT_A, a)).status_code == 200
    body = (await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.tenant_a)).json()
    assert body["share"] == 0.0
    async with db.transaction() as conn:
        # The quota rows as a pass moves them: a uses 3000 (borrows 2000).
        await quota_charge(conn, amounts={(TENANT_A, "gpu-small", "cpuMillis"): 3000},
                           exists=())
    body = (await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.tenant_a)).json()
    # 2000 borrowed of the 9000 the cohort can lend (both nominals), over weight 2.
    assert body["share"] == pytest.approx(2000 / 9000 / 2)
