"""The whole loop through the API: pools and capacity, heartbeat, submit, the reconciler
leases, the runtime completes, capacity is back — plus a pending task's explanation and a
cancelled lease releasing its capacity."""

from __future__ import annotations

REQUESTS = {"cpuMillis": 1000, "memoryMiB": 2048, "llmSlots": 1}
CAPACITY = {"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 4}
ZERO = {"cpuMillis": 0, "memoryMiB": 0, "llmSlots": 0}


async def pool(client, keys, pool_id: str) -> dict:
    r = await client.get(f"/v1/pools/{pool_id}", headers=keys.admin)
    assert r.status_code == 200, r.text
    return r.json()


async def test_submit_lease_complete_and_capacity_is_back(client, keys, pool_make, reconcile):
    await pool_make("pool-x", capacity=CAPACITY)
    await pool_make("pool-y", capacity=CAPACITY, costWeight=5.0, failureDomain="fd-2")
    beat = await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    assert beat.status_code == 200, beat.text

    spec = {"runtimeClass": "gpu-small", "requests": REQUESTS, "labels": {"app": "web"}}
    submitted = await client.post("/v1/tasks", json=spec, headers=keys.tenant_a)
    assert submitted.status_code == 201, submitted.text
    task_url = submitted.headers["location"]

    result = await reconcile()
    assert result.leased == 1, result

    task = (await client.get(task_url, headers=keys.tenant_a)).json()
    assert task["state"] == "LEASED"
    placement = task["placement"]
    # Both pools are healthy and empty; pool-y costs more, so pool-x wins.
    assert placement["poolId"] == "pool-x"
    assert placement["members"] == [{"poolId": "pool-x", "count": 1}]
    assert [a["poolId"] for a in placement["alternatives"]] == ["pool-y"]
    assert placement["alternatives"][0]["score"] <= placement["score"]
    assert {c["name"] for c in placement["components"]} >= {"least_loaded", "cost"}
    assert task["pendingReason"] is None
    lease = task["lease"]
    assert lease["runtimeInstanceId"] == "rt-1" and lease["poolId"] == "pool-x"
    assert lease["epoch"] >= 1

    busy = await pool(client, keys, "pool-x")
    assert busy["reserved"] == REQUESTS
    assert busy["available"] == {k: CAPACITY[k] - REQUESTS[k] for k in CAPACITY}

    listed = (await client.get("/v1/runtimes/rt-1/leases", headers=keys.runtime_1)).json()
    assert [item["id"] for item in listed["items"]] == [lease["id"]]

    done = await client.post(
        f"/v1/leases/{lease['id']}/complete",
        json={"outcome": "succeeded", "epoch": lease["epoch"]},
        headers=keys.runtime_1,
    )
    assert done.status_code == 200, done.text

    task = (await client.get(task_url, headers=keys.tenant_a)).json()
    assert task["state"] == "SUCCEEDED"
    assert task["lease"] is None and task["finishedAt"] is not None
    assert task["placement"]["poolId"] == "pool-x"  # the explanation stays
    free = await pool(client, keys, "pool-x")
    assert free["reserved"] == ZERO and free["available"] == CAPACITY

    events = (await client.get(f"{task_url}/events", headers=keys.tenant_a)).json()["items"]
    states = [e["toState"] for e in events]
    assert states[0] == "ADMITTED" and states[-2:] == ["LEASED", "SUCCEEDED"]


async def test_a_task_that_fits_nowhere_explains_why(client, keys, pool_make, reconcile):
    await pool_make("pool-x", capacity=CAPACITY)
    await pool_make("pool-b", tenant_ids=["tenant-b"], capacity={**CAPACITY, "cpuMillis": 64000})
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    spec = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 32000}}
    r = await client.post("/v1/tasks", json=spec, headers=keys.tenant_a)
    await reconcile()
    task = (await client.get(r.headers["location"], headers=keys.tenant_a)).json()
    assert task["state"] == "ADMITTED"
    assert task["placement"] is None and task["lease"] is None
    reason = task["pendingReason"]
    # pool-x has 4000m in all: the task can never fit there (and pool-b is not its own).
    assert reason["code"] == "never_fits"
    # Only pool-x is visible to tenant-a; pool-b would fit but is neither counted nor named.
    assert reason["rejections"] == {"insufficient_cpu": 1}
    assert "pool-b" not in reason["message"]


async def test_cancelling_a_leased_task_releases_its_capacity(client, keys, pool_make, reconcile):
    await pool_make("pool-x", capacity=CAPACITY)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    spec = {"runtimeClass": "gpu-small", "requests": REQUESTS}
    r = await client.post("/v1/tasks", json=spec, headers=keys.tenant_a)
    await reconcile()
    task = (await client.get(r.headers["location"], headers=keys.tenant_a)).json()
    assert task["state"] == "LEASED"
    assert (await pool(client, keys, "pool-x"))["reserved"] == REQUESTS

    cancelled = await client.post(f"{r.headers['location']}/cancel", headers=keys.tenant_a)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "CANCELLED" and cancelled.json()["lease"] is None
    assert (await pool(client, keys, "pool-x"))["reserved"] == ZERO
    stale = await client.post(
        f"/v1/leases/{task['lease']['id']}/complete",
        json={"outcome": "succeeded", "epoch": task["lease"]["epoch"]},
        headers=keys.runtime_1,
    )
    assert stale.status_code in (404, 409), stale.text


async def test_an_alternative_that_stops_listing_the_tenant_leaves_the_explanation(
    client, keys, pool_make, reconcile
):
    await pool_make("pool-x", capacity=CAPACITY)
    await pool_make("pool-y", capacity=CAPACITY, costWeight=5.0)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    spec = {"runtimeClass": "gpu-small", "requests": REQUESTS}
    r = await client.post("/v1/tasks", json=spec, headers=keys.tenant_a)
    await reconcile()
    task = (await client.get(r.headers["location"], headers=keys.tenant_a)).json()
    assert [a["poolId"] for a in task["placement"]["alternatives"]] == ["pool-y"]

    patched = await client.patch("/v1/pools/pool-y", json={"tenantIds": ["tenant-b"]},
                                 headers=keys.admin)
    assert patched.status_code == 200, patched.text
    task = (await client.get(r.headers["location"], headers=keys.tenant_a)).json()
    assert task["placement"]["poolId"] == "pool-x"
    assert task["placement"]["alternatives"] == []
    listed = (await client.get("/v1/tasks", headers=keys.tenant_a)).json()["items"]
    assert listed[0]["placement"]["alternatives"] == []


async def test_gang_task_view_names_the_same_pools_in_placement_and_leases(
    client, keys, pool_make, reconcile
):
    # pool-a sorts first by id but costs more: the placement's pool is pool-b.
    await pool_make("pool-a", capacity=CAPACITY, costWeight=5.0)
    await pool_make("pool-b", capacity=CAPACITY)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    spec = {"runtimeClass": "gpu-small", "requests": REQUESTS,
            "gang": {"members": 2, "maxPerPool": 1}}
    submitted = await client.post("/v1/tasks", json=spec, headers=keys.tenant_a)
    assert submitted.status_code == 201, submitted.text
    assert (await reconcile()).leased == 1

    task = (await client.get(submitted.headers["location"], headers=keys.tenant_a)).json()
    placement = task["placement"]
    assert placement["poolId"] == "pool-b"
    assert [m["poolId"] for m in placement["members"]] == ["pool-b", "pool-a"]
    assert task["lease"]["poolId"] == placement["poolId"]
    assert [lease["poolId"] for lease in task["leases"]] == ["pool-b", "pool-a"]
