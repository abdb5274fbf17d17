"""Cohort trees through the API, with a reconciler on a real database: an organisation of
three levels (org -> two teams -> tenants), where a tenant borrows from its sibling before
its aunt, a team's guarantee holds against the other team's burst and every level's usage
row equals the live leases it covers; the tree's own rules (depth, cycles, deletes) and
what a tenant key sees."""

from __future__ import annotations

from app.ledger.invariants import ledger_check
from app.ledger.keys import api_key_create
from tests.api.conftest import TENANT_A, TENANT_B, assert_problem
from tests.factories import ledger_violations

TENANT_C = "tenant-c"
BIG = {"cpuMillis": 64000, "memoryMiB": 65536, "llmSlots": 0}


async def _cohort(client, keys, cohort: str, parent: str | None, **extra) -> dict:
    r = await client.put(f"/v1/cohorts/{cohort}", json={"parent": parent, **extra},
                         headers=keys.admin)
    assert r.status_code == 200, r.text
    return r.json()


async def _tenant(client, keys, tenant: str, cohort: str, nominal: int) -> None:
    body = {"cohort": cohort, "quotas": {"gpu-small": {"cpuMillis": {"nominal": nominal}}}}
    r = await client.put(f"/v1/tenants/{tenant}", json=body, headers=keys.admin)
    assert r.status_code == 200, r.text


async def _org(client, keys) -> None:
    """org -> team1 (a, b: 4000m each), team2 (c: 8000m); everyone lends everything."""
    await _cohort(client, keys, "org", None)
    await _cohort(client, keys, "team1", "org")
    await _cohort(client, keys, "team2", "org", fairWeight=2)
    await _tenant(client, keys, TENANT_A, "team1", 4000)
    await _tenant(client, keys, TENANT_B, "team1", 4000)
    await _tenant(client, keys, TENANT_C, "team2", 8000)


async def _submit(client, headers: dict, tenant: str, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = await client.post("/v1/tasks", json={"runtimeClass": "gpu-small",
                                                 "requests": {"cpuMillis": 1000}},
                              headers={**headers, "X-Berth-Tenant": tenant})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


async def _cpu(client, keys, what: str) -> dict:
    doc = (await client.get(f"/v1/{what}", headers=keys.admin)).json()
    return {k: v["cpuMillis"] for k, v in doc["usage"]["gpu-small"].items()}


async def test_an_organisation_lends_level_by_level(
    client, keys, pool_make, reconcile, db
) -> None:
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B, TENANT_C], capacity=BIG)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    await _org(client, keys)
    async with db.transaction() as conn:
        raw = await api_key_create(conn, role="tenant", subject="org",
                                   tenant_ids=[TENANT_A, TENANT_B, TENANT_C])
    key = {"Authorization": f"Bearer {raw}"}

    await _submit(client, key, TENANT_C, 6)
    await reconcile()
    a = await _submit(client, key, TENANT_A, 12)
    await reconcile()
    got = [(await client.get(f"/v1/tasks/{t}", headers=key | {"X-Berth-Tenant": TENANT_A}))
           .json() for t in a]
    # Its own 4000m, all 4000m of its sibling b, then 2000m that team2 does not use.
    assert [t["state"] for t in got].count("LEASED") == 10
    waiting = got[-1]["pendingReason"]
    assert waiting["code"] == "quota_borrow_unavailable"
    assert waiting["message"] == (
        "needs 1000m cpu; tenant-a uses 10000m of 4000m nominal, cohort org on its path can "
        "lend 0m now")
    # team1 borrowed from org only what b could not lend.
    assert await _cpu(client, keys, "cohorts/team1") == {
        "used": 10000, "borrowed": 2000, "lendable": 0}
    assert await _cpu(client, keys, "cohorts/org") == {"used": 16000, "borrowed": 0,
                                                       "lendable": 0}
    tenant_a = (await client.get(f"/v1/tenants/{TENANT_A}", headers=keys.admin)).json()
    assert tenant_a["path"] == ["team1", "org"]
    assert tenant_a["usage"]["gpu-small"]["borrowed"]["cpuMillis"] == 6000
    # team1 lends all of its 8000m up to org: what it can make available is org's 16000m.
    assert tenant_a["share"] == 6000 / 16000

    # team2's guarantee holds: c gets the rest of its nominal though org lent it all.
    c = await _submit(client, key, TENANT_C, 2)
    await reconcile()
    for t in c:
        got_c = (await client.get(f"/v1/tasks/{t}", headers=key | {"X-Berth-Tenant": TENANT_C}))
        assert got_c.json()["state"] == "LEASED"
    # ...and beyond it, nothing: no level above lends now.
    more = await _submit(client, key, TENANT_C, 1)
    await reconcile()
    got_c = (await client.get(f"/v1/tasks/{more[0]}", headers=key | {"X-Berth-Tenant": TENANT_C}))
    assert got_c.json()["pendingReason"]["code"] == "quota_borrow_unavailable"

    # Every level's row equals the live leases it covers.
    assert await _cpu(client, keys, "cohorts/team2") == {"used": 8000, "borrowed": 0,
                                                         "lendable": 0}
    assert (await _cpu(client, keys, "cohorts/org"))["used"] == 18000
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}
        leases = await conn.fetchval(
            "SELECT sum(r.cpu) FROM reservations r JOIN tasks t ON t.id = r.task_id "
            "WHERE NOT r.hold")
        assert await conn.fetchval(
            "SELECT used FROM cohort_usage WHERE cohort = 'org' AND resource = 'cpuMillis'"
        ) == leases == 18000


async def test_depth_cycles_and_deletes_are_refused(client, keys) -> None:
    for i in range(8):
        await _cohort(client, keys, f"l{i}", f"l{i - 1}" if i else None)
    # A ninth level is too deep, and so is hanging the chain under another root.
    assert_problem(await client.put("/v1/cohorts/l8", json={"parent": "l7"},
                                    headers=keys.admin), 409)
    await _cohort(client, keys, "top", None)
    assert_problem(await client.put("/v1/cohorts/l0", json={"parent": "top"},
                                    headers=keys.admin), 409)
    # A cycle: l0 under its own descendant, or under itself.
    r = await client.put("/v1/cohorts/l0", json={"parent": "l3"}, headers=keys.admin)
    assert "cycle" in assert_problem(r, 409)["type"]
    assert_problem(await client.put("/v1/cohorts/l0", json={"parent": "l0"},
                                    headers=keys.admin), 409)
    # A cohort with children or members stays.
    assert_problem(await client.delete("/v1/cohorts/l6", headers=keys.admin), 409)
    await _tenant(client, keys, TENANT_A, "l7", 1000)
    r = await client.delete("/v1/cohorts/l7", headers=keys.admin)
    assert "1 member tenants" in assert_problem(r, 409)["detail"]
    await _tenant(client, keys, TENANT_A, "top", 1000)
    assert (await client.delete("/v1/cohorts/l7", headers=keys.admin)).status_code == 204
    assert_problem(await client.delete("/v1/cohorts/l7", headers=keys.admin), 404)
    # Bad ids and weights are 422 before anything is read.
    assert_problem(await client.put("/v1/cohorts/Bad%20Id", json={}, headers=keys.admin), 422)
    assert_problem(await client.put("/v1/cohorts/x", json={"fairWeight": 1e-320},
                                    headers=keys.admin), 422)
    assert_problem(await client.put("/v1/cohorts/x", json={}, headers=keys.tenant_a), 403)


async def test_a_tenant_key_sees_only_the_cohorts_on_its_path(client, keys) -> None:
    await _org(client, keys)
    await _cohort(client, keys, "elsewhere", None)
    listed = (await client.get("/v1/cohorts", headers=keys.tenant_a)).json()
    assert [c["id"] for c in listed["items"]] == ["org", "team1"]
    assert (await client.get("/v1/cohorts/org", headers=keys.tenant_a)).status_code == 200
    for other in ("team2", "elsewhere", "nowhere"):
        r = await client.get(f"/v1/cohorts/{other}", headers=keys.tenant_a)
        assert_problem(r, 404)
    everything = (await client.get("/v1/cohorts", headers=keys.admin)).json()
    assert {"org", "team1", "team2", "elsewhere", "default"} <= {
        c["id"] for c in everything["items"]}
    # A tenant's document names no other tenant.
    doc = (await client.get("/v1/cohorts/team1", headers=keys.tenant_a)).text
    assert TENANT_B not in doc


async def test_a_cohort_change_wakes_only_its_subtree(
    client, keys, pool_make, reconcile, db
) -> None:
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B], capacity=BIG)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    await _cohort(client, keys, "org", None)
    await _cohort(client, keys, "team1", "org")
    await _cohort(client, keys, "team2", "org")
    await _tenant(client, keys, TENANT_A, "team1", 0)
    await _tenant(client, keys, TENANT_B, "team2", 0)
    waiting = {}
    for tenant, key in ((TENANT_A, keys.tenant_a), (TENANT_B, keys.tenant_b)):
        waiting[tenant] = (await _submit(client, key, tenant, 1))[0]
    await reconcile()

    async def parked() -> dict[str, bool]:
        async with db.connection() as conn:
            return {t: await conn.fetchval("SELECT parked FROM tasks WHERE id = $1::uuid", i)
                    for t, i in waiting.items()}

    assert await parked() == {TENANT_A: True, TENANT_B: True}
    # team1 gets capacity of its own: its member's task is woken, team2's is not.
    await _cohort(client, keys, "team1", "org",
                  quotas={"gpu-small": {"cpuMillis": {"nominal": 1000}}})
    assert await parked() == {TENANT_A: False, TENANT_B: True}
    await reconcile()
    got = (await client.get(f"/v1/tasks/{waiting[TENANT_A]}", headers=keys.tenant_a)).json()
    assert got["state"] == "LEASED"
    assert await _cpu(client, keys, "cohorts/team1") == {"used": 1000, "borrowed": 0,
                                                         "lendable": 0}


async def test_a_class_only_a_cohort_has_quota_in_is_managed(
    client, keys, pool_make, reconcile, db
) -> None:
    await pool_make("pool-x", tenant_ids=[TENANT_A], capacity=BIG)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    await _cohort(client, keys, "team1", None,
                  quotas={"gpu-small": {"cpuMillis": {"nominal": 2000}}})
    r = await client.put(f"/v1/tenants/{TENANT_A}", json={"cohort": "team1"},
                         headers=keys.admin)
    assert r.status_code == 200, r.text
    ids = await _submit(client, keys.tenant_a, TENANT_A, 3)
    await reconcile()
    got = [(await client.get(f"/v1/tasks/{t}", headers=keys.tenant_a)).json() for t in ids]
    # tenant-a has no quota of its own: it runs on what team1 holds, 2000m.
    assert [t["state"] for t in got] == ["LEASED", "LEASED", "ADMITTED"]
    assert got[2]["pendingReason"]["code"] == "quota_borrow_unavailable"
    assert await _cpu(client, keys, "cohorts/team1") == {"used": 2000, "borrowed": 0,
                                                         "lendable": 0}
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}
