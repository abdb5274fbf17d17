"""What the tenants API accepts: ids and cohorts of one pattern, weights within their range,
X-Berth-Tenant honoured or refused, sealed cursors; and a quota change wakes only the tasks
it could help."""

from __future__ import annotations

import base64

import orjson
import pytest

from tests.api.conftest import TENANT_A, TENANT_B, assert_problem
from tests.api.test_quota_admission import set_tenant, shared, submit

__all__ = ["shared"]  # the fixture, used by name


@pytest.mark.parametrize("tenant_id", [
    "has space", "new%0Aline", "rtl\u202eoverride", "Upper", "-dash-first", "a" * 64, ".dot",
])
async def test_a_tenant_id_outside_the_pattern_is_422(client, keys, tenant_id) -> None:
    r = await client.put(f"/v1/tenants/{tenant_id}", json={}, headers=keys.admin)
    body = assert_problem(r, 422)
    assert "a-z0-9" in r.text, body


@pytest.mark.parametrize("tenant_id", ["a", "acme", "team-1.batch_2", "0" + "a" * 62])
async def test_a_tenant_id_within_the_pattern_is_taken(client, keys, tenant_id) -> None:
    r = await client.put(f"/v1/tenants/{tenant_id}", json={}, headers=keys.admin)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == tenant_id


@pytest.mark.parametrize("body", [
    {"cohort": "Research"}, {"cohort": "a b"}, {"cohort": ""}, {"cohort": "x" * 64},
    {"fairWeight": 1e-320}, {"fairWeight": 0}, {"fairWeight": 0.0009}, {"fairWeight": 1000.5},
    {"fairWeight": -1},
], ids=lambda b: repr(b))
async def test_a_cohort_or_weight_out_of_range_is_422(client, keys, body) -> None:
    r = await client.put(f"/v1/tenants/{TENANT_A}", json=body, headers=keys.admin)
    assert_problem(r, 422)
    got = await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.admin)
    assert got.json()["updatedAt"] is None  # nothing stored


@pytest.mark.parametrize("weight", [0.001, 1000])
async def test_weights_at_the_bounds_are_taken(client, keys, weight) -> None:
    r = await client.put(f"/v1/tenants/{TENANT_A}", json={"fairWeight": weight},
                         headers=keys.admin)
    assert r.status_code == 200, r.text


async def test_x_berth_tenant_narrows_or_is_400(client, keys) -> None:
    for tenant in (TENANT_A, TENANT_B):
        assert (await client.put(f"/v1/tenants/{tenant}", json={},
                                 headers=keys.admin)).status_code == 200
    # A tenant key: its own tenant, or 400 for another.
    r = await client.get("/v1/tenants", headers={**keys.tenant_a, "X-Berth-Tenant": TENANT_A})
    assert [t["id"] for t in r.json()["items"]] == [TENANT_A]
    for path in ("/v1/tenants", f"/v1/tenants/{TENANT_A}", "/v1/pools"):
        r = await client.get(path, headers={**keys.tenant_a, "X-Berth-Tenant": TENANT_B})
        assert_problem(r, 400)
    # An admin: the header narrows a read to that tenant, and a write must name the same.
    r = await client.get("/v1/tenants", headers={**keys.admin, "X-Berth-Tenant": TENANT_B})
    assert [t["id"] for t in r.json()["items"]] == [TENANT_B]
    r = await client.get(f"/v1/tenants/{TENANT_A}",
                         headers={**keys.admin, "X-Berth-Tenant": TENANT_B})
    assert_problem(r, 404)
    r = await client.put(f"/v1/tenants/{TENANT_A}", json={},
                         headers={**keys.admin, "X-Berth-Tenant": TENANT_B})
    assert_problem(r, 400)
    r = await client.put(f"/v1/tenants/{TENANT_A}", json={},
                         headers={**keys.admin, "X-Berth-Tenant": TENANT_A})
    assert r.status_code == 200, r.text


async def test_a_forged_cursor_is_400_and_a_real_one_pages(client, keys) -> None:
    for tenant in ("t1", "t2", "t3"):
        assert (await client.put(f"/v1/tenants/{tenant}", json={},
                                 headers=keys.admin)).status_code == 200
    first = (await client.get("/v1/tenants?limit=2", headers=keys.admin)).json()
    assert [t["id"] for t in first["items"]] == ["t1", "t2"]
    nxt = await client.get(f"/v1/tenants?limit=2&cursor={first['nextCursor']}",
                           headers=keys.admin)
    assert [t["id"] for t in nxt.json()["items"]] == ["t3"]
    forged = base64.urlsafe_b64encode(orjson.dumps("t1")).decode().rstrip("=")
    for path in ("/v1/tenants", "/v1/pools", "/v1/keys"):
        r = await client.get(f"{path}?cursor={forged}", headers=keys.admin)
        assert_problem(r, 400)
    # A cursor of one list does not open another.
    r = await client.get(f"/v1/pools?cursor={first['nextCursor']}", headers=keys.admin)
    assert_problem(r, 400)


async def test_a_quota_change_wakes_only_its_tenant_cohort_and_class(
    client, keys, shared, pool_make, db
) -> None:
    await set_tenant(client, keys, TENANT_A, "c", nominal=0, borrowingLimit=0)
    await set_tenant(client, keys, TENANT_B, "d", nominal=0, borrowingLimit=0)
    a = await submit(client, keys, "tenant_a", 2)
    b = await submit(client, keys, "tenant_b", 2)
    # Both parked by their quota, in gpu-small; two more parked in another class.
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE tasks SET parked = true, pending_reason = '{\"code\": \"quota_exceeded\"}' "
            "WHERE id = ANY($1::uuid[])", [*a, *b])
        await conn.execute(
            "UPDATE tasks SET runtime_class = 'gpu-large' WHERE id = ANY($1::uuid[])", a[1:])
    await set_tenant(client, keys, TENANT_A, "c", nominal=4000)
    async with db.connection() as conn:
        parked = {str(r[0]) for r in await conn.fetch("SELECT id FROM tasks WHERE parked")}
    # Only tenant-a's task of gpu-small came back; b's (another cohort) and a's other class
    # stay parked.
    assert parked == {a[1], *b}
