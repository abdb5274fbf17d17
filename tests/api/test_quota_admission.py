"""Admission by quota, through the API and a reconciler on a real database: borrowing up to
what the cohort lends, lending and borrowing limits, no borrowing across cohorts, the quota
reasons with their numbers, and usage rows that follow every lease."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime

import pytest

from app.ledger.invariants import ledger_check
from app.ledger.wakeups import Wakeup
from app.metrics import QUOTA_BORROWED, QUOTA_NOMINAL, QUOTA_USED, TASKS_PENDING
from tests.api.conftest import TENANT_A, TENANT_B, assert_problem
from tests.factories import ledger_violations

BIG = {"cpuMillis": 32000, "memoryMiB": 65536, "llmSlots": 0}


@pytest.fixture
async def shared(client, keys, pool_make):
    """One big pool of class gpu-small open to both tenants, its runtime healthy."""
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B], capacity=BIG)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)


async def set_tenant(client, keys, tenant: str, cohort: str, **cpu) -> None:
    body = {"cohort": cohort, "quotas": {"gpu-small": {"cpuMillis": cpu}}}
    r = await client.put(f"/v1/tenants/{tenant}", json=body, headers=keys.admin)
    assert r.status_code == 200, r.text


async def submit(client, keys, tenant_key: str, n: int, cpu: int = 1000) -> list[str]:
    ids = []
    for _ in range(n):
        r = await client.post("/v1/tasks", json={"runtimeClass": "gpu-small",
                                                 "requests": {"cpuMillis": cpu}},
                              headers=keys[tenant_key])
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


async def states(client, keys, tenant_key: str, ids: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for task_id in ids:
        t = (await client.get(f"/v1/tasks/{task_id}", headers=keys[tenant_key])).json()
        out.append((t["state"], (t["pendingReason"] or {}).get("code")))
    return out


async def usage(client, keys, tenant: str, tenant_key: str) -> dict:
    r = await client.get(f"/v1/tenants/{tenant}", headers=keys[tenant_key])
    return {k: v["cpuMillis"] for k, v in r.json()["usage"]["gpu-small"].items()}


async def sound(db) -> None:
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}


async def test_borrowing_up_to_what_the_cohort_lends(
    client, keys, shared, reconcile, reconciler, db
):
    await set_tenant(client, keys, TENANT_A, "c", nominal=4000)
    await set_tenant(client, keys, TENANT_B, "c", nominal=2000)
    ids = await submit(client, keys, "tenant_b", 7)

    await reconcile()

    got = await states(client, keys, "tenant_b", ids)
    # 2000 of its own and all of a's unused 4000: six tasks; the seventh waits.
    assert [s for s, _ in got].count("LEASED") == 6
    assert got[-1] == ("ADMITTED", "quota_borrow_unavailable")
    task = (await client.get(f"/v1/tasks/{ids[-1]}", headers=keys.tenant_b)).json()
    assert task["pendingReason"]["message"] == (
        "needs 1000m cpu; tenant-b uses 6000m of 2000m nominal, its cohort can lend 0m now")
    assert task["queue"]["position"] is None
    assert "quota" in task["queue"]["estimate"]
    assert await usage(client, keys, TENANT_B, "tenant_b") == {
        "used": 6000, "borrowed": 4000, "borrowable": 0}
    # a's nominal is still a's: within it, it is admitted although b borrowed all of it.
    mine = await submit(client, keys, "tenant_a", 4)
    await reconcile()
    assert [s for s, _ in await states(client, keys, "tenant_a", mine)] == ["LEASED"] * 4
    await sound(db)
    queue = (await client.get("/v1/queue", headers=keys.tenant_b)).json()
    assert queue["byReason"] == {"quota_borrow_unavailable": 1}
    await reconciler.queue_gauges_refresh()
    labels = (TENANT_B, "gpu-small", "cpuMillis")
    assert QUOTA_NOMINAL.labels(*labels)._value.get() == 2000
    assert QUOTA_USED.labels(*labels)._value.get() == 6000
    assert QUOTA_BORROWED.labels(*labels)._value.get() == 4000
    assert TASKS_PENDING.labels(reason="quota_borrow_unavailable")._value.get() == 1


async def test_lending_limit_bounds_what_others_borrow(client, keys, shared, reconcile, db):
    await set_tenant(client, keys, TENANT_A, "c", nominal=4000, lendingLimit=1000)
    await set_tenant(client, keys, TENANT_B, "c", nominal=2000)
    ids = await submit(client, keys, "tenant_b", 4)
    await reconcile()
    got = await states(client, keys, "tenant_b", ids)
    assert [s for s, _ in got] == ["LEASED"] * 3 + ["ADMITTED"]
    assert got[-1][1] == "quota_borrow_unavailable"
    await sound(db)


async def test_borrowing_limit_is_the_tenants_own_limit(client, keys, shared, reconcile, db):
    await set_tenant(client, keys, TENANT_A, "c", nominal=4000)
    await set_tenant(client, keys, TENANT_B, "c", nominal=2000, borrowingLimit=500)
    ids = await submit(client, keys, "tenant_b", 6, cpu=500)
    await reconcile()
    got = await states(client, keys, "tenant_b", ids)
    assert [s for s, _ in got] == ["LEASED"] * 5 + ["ADMITTED"]
    assert got[-1][1] == "quota_exceeded"
    task = (await client.get(f"/v1/tasks/{ids[-1]}", headers=keys.tenant_b)).json()
    assert task["pendingReason"]["message"] == (
        "needs 500m cpu; tenant-b uses 2500m of 2000m nominal and may borrow at most 500m")
    await sound(db)


async def test_no_borrowing_across_cohorts(client, keys, shared, reconcile, db):
    await set_tenant(client, keys, TENANT_A, "c1", nominal=4000)
    await set_tenant(client, keys, TENANT_B, "c2", nominal=2000)
    ids = await submit(client, keys, "tenant_b", 3)
    await reconcile()
    got = await states(client, keys, "tenant_b", ids)
    assert [s for s, _ in got] == ["LEASED"] * 2 + ["ADMITTED"]
    assert got[-1][1] == "quota_borrow_unavailable"
    await sound(db)


async def test_usage_returns_with_every_lease_end_and_a_waiting_task_then_fits(
    client, keys, shared, reconcile, reconciler, wakeups, db
):
    await set_tenant(client, keys, TENANT_B, "c", nominal=2000)
    ids = await submit(client, keys, "tenant_b", 3)
    await reconcile()
    assert [s for s, _ in await states(client, keys, "tenant_b", ids)] == [
        "LEASED", "LEASED", "ADMITTED"]
    leases = {x["taskId"]: x for x in (await client.get(
        "/v1/runtimes/rt-1/leases", headers=keys.runtime_1)).json()["items"]}
    # One completes, one is cancelled: both return their usage in the same transaction.
    first = leases[ids[0]]
    r = await client.post(f"/v1/leases/{first['id']}/complete",
                          json={"outcome": "succeeded", "epoch": first["epoch"]},
                          headers=keys.runtime_1)
    assert r.status_code == 200
    await sound(db)
    assert (await client.post(f"/v1/tasks/{ids[1]}/cancel",
                              headers=keys.tenant_b)).status_code == 200
    await sound(db)
    assert (await usage(client, keys, TENANT_B, "tenant_b"))["used"] == 0
    # The parked task waits for usage in its class to drop: the capacity released by the
    # completion wakes it (its wake keys), and it fits its quota now.
    while not wakeups.empty():
        reconciler.wakeup(Wakeup.parse(wakeups.get_nowait()))
    assert await reconciler.unpark(now=datetime.now(UTC)) == 1
    await reconcile()
    assert (await states(client, keys, "tenant_b", ids))[2] == ("LEASED", None)
    await sound(db)


async def test_a_quota_below_usage_is_409_and_changes_nothing(
    client, keys, shared, reconcile, db
):
    await set_tenant(client, keys, TENANT_B, "c", nominal=2000, borrowingLimit=0)
    await submit(client, keys, "tenant_b", 2)
    await reconcile()
    body = {"cohort": "c", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 1000,
                                                                  "borrowingLimit": 0}}}}
    r = await client.put(f"/v1/tenants/{TENANT_B}", json=body, headers=keys.admin)
    assert r.status_code == 409, r.text
    assert "below what it uses now" in r.json()["detail"]
    got = (await client.get(f"/v1/tenants/{TENANT_B}", headers=keys.admin)).json()
    assert got["quotas"]["gpu-small"]["cpuMillis"]["nominal"] == 2000
    await sound(db)


async def test_a_class_nobody_has_a_quota_in_is_not_limited(
    client, keys, shared, reconcile, reconciler, wakeups, db
):
    await set_tenant(client, keys, TENANT_A, "c", nominal=1000)
    body = {"cohort": "c",
            "quotas": {"other-class": {"cpuMillis": {"nominal": 0, "borrowingLimit": 0}}}}
    assert (await client.put(f"/v1/tenants/{TENANT_B}", json=body,
                             headers=keys.admin)).status_code == 200
    ids = await submit(client, keys, "tenant_b", 5)
    await reconcile()
    # gpu-small is managed (a has a quota): b has nominal 0 there and borrows a's 1000.
    got = await states(client, keys, "tenant_b", ids)
    assert [s for s, _ in got].count("LEASED") == 1
    assert got[-1] == ("ADMITTED", "quota_borrow_unavailable")
    await sound(db)
    # The admin removes a's quota: nobody has one in gpu-small now, so nothing limits it,
    # and the change unparks the parked tasks of its cohort in that class itself.
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE parked") == 4
    assert (await client.put(f"/v1/tenants/{TENANT_A}", json={"cohort": "c"},
                             headers=keys.admin)).status_code == 200
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE parked") == 0
    await reconcile()
    assert [s for s, _ in await states(client, keys, "tenant_b", ids)] == ["LEASED"] * 5
    await sound(db)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM quota_usage "
                                   "WHERE runtime_class = 'gpu-small'") == 0


async def test_a_task_its_quota_stops_is_estimated_by_its_tenants_leases_ending(
    client, keys, shared, reconcile, db
):
    await set_tenant(client, keys, TENANT_B, "solo", nominal=2000, borrowingLimit=0)
    ids = await submit(client, keys, "tenant_b", 3)
    await reconcile()
    assert (await states(client, keys, "tenant_b", ids))[-1] == ("ADMITTED", "quota_exceeded")
    # Two of tenant-b's leases completed over the last 15 minutes: one ends every 450 s.
    done = await submit(client, keys, "tenant_b", 2)
    async with db.transaction() as conn:
        for task_id, age in zip(done, (100, 400), strict=True):
            await conn.execute("UPDATE tasks SET state = 'SUCCEEDED' WHERE id = $1", task_id)
            await conn.execute(
                "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
                "granted_at, expires_at, ended_at) VALUES (gen_random_uuid(), $1, 'pool-x', "
                "'rt-1', 1, 'COMPLETED', now(), now(), now() - make_interval(secs => $2))",
                uuid.UUID(task_id), age)
    before = datetime.now(UTC)
    task = (await client.get(f"/v1/tasks/{ids[-1]}", headers=keys.tenant_b)).json()
    queue = task["queue"]
    # The planner admits it once the oldest of the tenant's own leases ends.
    assert queue["estimate"].startswith(
        "about 8 minutes: the planner places it on pool pool-x once the oldest live lease of "
        "its tenant in its runtime class has ended")
    assert queue["estimate"].endswith("(its tenant's quota admits it then)")
    start = datetime.fromisoformat(queue["estimatedStartAt"].replace("Z", "+00:00"))
    assert 440 <= (start - before).total_seconds() <= 460


def _wait(event: threading.Event) -> bool:
    return event.wait(10)


async def test_an_estimate_past_the_bound_on_previews_is_429_with_retry_after(
    app, client, keys, shared, reconcile
):
    await set_tenant(client, keys, TENANT_B, "solo", nominal=1000, borrowingLimit=0)
    ids = await submit(client, keys, "tenant_b", 2)
    await reconcile()
    fresh = await submit(client, keys, "tenant_b", 1)
    offload = app.state.offload
    release = threading.Event()
    held = [asyncio.ensure_future(offload.run(_wait, release))
            for _ in range(offload.max_concurrent)]
    await asyncio.sleep(0.05)
    try:
        # The planner is asked for the task its quota stops: no worker is free.
        r = await client.get(f"/v1/tasks/{ids[-1]}", headers=keys.tenant_b)
        problem = assert_problem(r, 429)
        assert r.headers["Retry-After"] == "1"
        assert "BERTH_PREVIEW_MAX_CONCURRENT" in problem["detail"]
        # A task no pass examined yet asks no worker.
        assert (await client.get(f"/v1/tasks/{fresh[0]}", headers=keys.tenant_b)).json()[
            "queue"]["estimate"].startswith("no estimate: not examined yet")
    finally:
        release.set()
        await asyncio.gather(*held)
    r = await client.get(f"/v1/tasks/{ids[-1]}", headers=keys.tenant_b)
    assert r.status_code == 200
    assert "quota" in r.json()["queue"]["estimate"]
