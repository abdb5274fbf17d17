"""The watch feed through the API: scope per role, commit order, cursors, lists' watchCursor."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.db import Database
from app.ledger.watch import FeedPosition
from app.services.watch import EVENT_TYPES, WatchCursors
from tests.api.conftest import (
    OPERATOR_X,
    RUNTIME_1,
    RUNTIME_2,
    TENANT_A,
    TENANT_B,
    Keys,
    PoolMaker,
    assert_problem,
)

REQUESTS = {"cpuMillis": 500, "memoryMiB": 256, "llmSlots": 1}


def spec(**fields: Any) -> dict[str, Any]:
    """Return a task spec that fits the test pools."""
    return {"runtimeClass": "gpu-small", "requests": REQUESTS, **fields}


async def poll(client: httpx.AsyncClient, headers: dict[str, str], *, after: str | None = None,
               wait: float = 0, **params: Any) -> dict[str, Any]:
    """Return one long-poll answer."""
    query: dict[str, Any] = {"wait": wait, **params}
    if after is not None:
        query["after"] = after
    answer = await client.get("/v1/watch", params=query, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def drain(client: httpx.AsyncClient, headers: dict[str, str], *,
                after: str | None = None, **params: Any) -> tuple[list[dict[str, Any]], str]:
    """Return every event after ``after`` available now, and the cursor after them."""
    events: list[dict[str, Any]] = []
    while True:
        page = await poll(client, headers, after=after, **params)
        after = page["cursor"]
        if not page["items"]:
            return events, after
        events += page["items"]


async def two_tenants(client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker,
                      reconcile: Any) -> dict[str, str]:
    """Make pool-a (tenant A, operator X, rt-1) and pool-b (tenant B, operator Y, rt-2),
    lease one task of each tenant; return the task ids by tenant."""
    await pool_make("pool-a", tenant_ids=(TENANT_A,), operators=[OPERATOR_X],
                    runtimeInstanceId=RUNTIME_1)
    await pool_make("pool-b", tenant_ids=(TENANT_B,), operators=["operator-y"],
                    runtimeInstanceId=RUNTIME_2)
    for rt, key in ((RUNTIME_1, keys.runtime_1), (RUNTIME_2, keys.runtime_2)):
        beat = await client.post(f"/v1/runtimes/{rt}/heartbeat", headers=key)
        assert beat.status_code == 200, beat.text
    ids = {}
    for tenant, key in ((TENANT_A, keys.tenant_a), (TENANT_B, keys.tenant_b)):
        made = await client.post("/v1/tasks", json=spec(), headers=key)
        assert made.status_code == 201, made.text
        ids[tenant] = made.json()["id"]
    result = await reconcile()
    assert result.leased == 2, result
    return ids


async def test_each_key_sees_exactly_what_it_may_read(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, reconcile: Any
) -> None:
    ids = await two_tenants(client, keys, pool_make, reconcile)

    admin, _ = await drain(client, keys.admin)
    assert {e["type"] for e in admin} >= {
        "pool.updated", "task.admitted", "task.leased", "lease.granted"}

    for tenant, key in ((TENANT_A, keys.tenant_a), (TENANT_B, keys.tenant_b)):
        seen, _ = await drain(client, key)
        assert [e["type"] for e in seen] == ["task.admitted", "task.leased"]
        assert {e["taskId"] for e in seen} == {ids[tenant]}
        assert {e["tenantId"] for e in seen} == {tenant}
        for e in seen:
            got = await client.get(f"/v1/tasks/{e['taskId']}", headers=key)
            assert got.status_code == 200

    for rt, key, pool in ((RUNTIME_1, keys.runtime_1, "pool-a"),
                          (RUNTIME_2, keys.runtime_2, "pool-b")):
        seen, _ = await drain(client, key)
        assert [e["type"] for e in seen] == ["lease.granted"]
        (granted,) = seen
        assert granted["poolId"] == pool and granted["data"]["runtimeInstanceId"] == rt
        assert "tenantId" not in granted
        leases = (await client.get(f"/v1/runtimes/{rt}/leases", headers=key)).json()
        assert [lease["id"] for lease in leases["items"]] == [granted["leaseId"]]

    seen, _ = await drain(client, keys.operator_x)
    assert {e["poolId"] for e in seen} == {"pool-a"}
    assert {e["type"] for e in seen} == {"pool.updated", "lease.granted"}
    got = await client.get("/v1/pools/pool-a", headers=keys.operator_x)
    assert got.status_code == 200


async def test_filters_narrow_what_the_key_sees(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, reconcile: Any
) -> None:
    ids = await two_tenants(client, keys, pool_make, reconcile)
    seen, _ = await drain(client, keys.admin, types="lease")
    assert {e["type"] for e in seen} == {"lease.granted"} and len(seen) == 2
    seen, _ = await drain(client, keys.admin, types="task.leased,pool")
    assert {e["type"] for e in seen} == {"task.leased", "pool.updated"}
    seen, _ = await drain(client, keys.admin, taskId=ids[TENANT_B])
    assert {e["taskId"] for e in seen} == {ids[TENANT_B]}
    seen, _ = await drain(client, keys.admin, poolId="pool-a", types="pool")
    assert seen and {e["poolId"] for e in seen} == {"pool-a"}
    seen, _ = await drain(client, keys.admin, runtimeClass="cpu-large")
    assert seen == []
    bad = await client.get("/v1/watch", params={"types": "task.exploded"}, headers=keys.admin)
    assert_problem(bad, 400)


async def test_a_transaction_that_commits_late_is_not_skipped(
    client: httpx.AsyncClient, keys: Keys, db: Database
) -> None:
    first = await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)
    task_id = first.json()["id"]
    _, cursor = await drain(client, keys.tenant_a)

    # A writer takes its event id, then stays open while later ids commit.
    held = await db.connect()
    try:
        tx = held.transaction()
        await tx.start()
        await held.execute(
            "INSERT INTO task_events (task_id, from_state, to_state, reason) "
            "VALUES ($1, 'ADMITTED', 'ADMITTED', 'insufficient_cpu')", first.json()["id"])
        later = await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)
        seen, cursor = await drain(client, keys.tenant_a, after=cursor)
        assert [(e["type"], e["taskId"]) for e in seen] == [
            ("task.admitted", later.json()["id"])]
        await tx.commit()
    finally:
        await held.close()

    seen, cursor = await drain(client, keys.tenant_a, after=cursor)
    assert [(e["type"], e["taskId"]) for e in seen] == [("task.pending", task_id)]
    again, _ = await drain(client, keys.tenant_a, after=cursor)
    assert again == []


async def test_each_event_cursor_resumes_after_that_event(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    made = [(await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)).json()["id"]
            for _ in range(3)]
    seen, _ = await drain(client, keys.tenant_a)
    assert [e["taskId"] for e in seen] == made
    rest, _ = await drain(client, keys.tenant_a, after=seen[0]["cursor"])
    assert [e["taskId"] for e in rest] == made[1:]


async def test_after_now_starts_at_the_present(client: httpx.AsyncClient, keys: Keys) -> None:
    await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)
    page = await poll(client, keys.tenant_a, after="now")
    assert page["items"] == []
    new = (await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)).json()["id"]
    seen, _ = await drain(client, keys.tenant_a, after=page["cursor"])
    assert [e["taskId"] for e in seen] == [new]


async def test_a_long_poll_answers_when_an_event_commits(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    page = await poll(client, keys.tenant_a, after="now")
    waiting = asyncio.create_task(poll(client, keys.tenant_a, after=page["cursor"], wait=20))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    new = (await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)).json()["id"]
    answer = await asyncio.wait_for(waiting, 10)
    assert [e["taskId"] for e in answer["items"]] == [new]


async def test_lists_carry_a_watch_cursor_that_misses_nothing(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-a")
    await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)
    for path, key in (("/v1/tasks", keys.tenant_a), ("/v1/pools", keys.admin),
                      (f"/v1/runtimes/{RUNTIME_1}/leases", keys.runtime_1)):
        listed = await client.get(path, headers=key)
        assert listed.status_code == 200, listed.text
        assert listed.json()["watchCursor"], path
    cursor = (await client.get("/v1/tasks", headers=keys.tenant_a)).json()["watchCursor"]
    new = (await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)).json()["id"]
    seen, _ = await drain(client, keys.tenant_a, after=cursor)
    assert [e["taskId"] for e in seen] == [new]


@pytest.mark.parametrize("cursor", ["garbage", "AAAA", "x" * 60])
async def test_a_malformed_cursor_is_400(
    client: httpx.AsyncClient, keys: Keys, cursor: str
) -> None:
    answer = await client.get("/v1/watch", params={"after": cursor, "wait": 0},
                              headers=keys.admin)
    assert assert_problem(answer, 400)["type"].endswith("cursor-invalid")


async def test_a_forged_cursor_is_400(client: httpx.AsyncClient, keys: Keys) -> None:
    page = await poll(client, keys.admin, after="now")
    real = page["cursor"]
    flipped = real[:10] + ("A" if real[10] != "A" else "B") + real[11:]
    answer = await client.get("/v1/watch", params={"after": flipped, "wait": 0},
                              headers=keys.admin)
    assert_problem(answer, 400)


async def test_a_cursor_older_than_the_retention_is_410(
    app: Any, client: httpx.AsyncClient, keys: Keys
) -> None:
    tokens = await app.state.tokens.get()
    retention = timedelta(hours=app.state.settings.finished_task_retention_hours)
    cursors = WatchCursors(tokens, retention)
    old = cursors.seal(FeedPosition(5, 10, 12, (10,)), now=datetime.now(UTC) - retention)
    answer = await client.get("/v1/watch", params={"after": old, "wait": 0},
                              headers=keys.tenant_a)
    body = assert_problem(answer, 410)
    assert body["type"].endswith("cursor-expired")
    fresh = cursors.seal(FeedPosition(5, 10, 12, (10,)), now=datetime.now(UTC))
    assert (await client.get("/v1/watch", params={"after": fresh, "wait": 0},
                             headers=keys.tenant_a)).status_code == 200


async def test_every_change_of_a_task_lease_and_pool_is_an_event_in_order(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, reconcile: Any, db: Database
) -> None:
    await pool_make("pool-a")
    await client.post(f"/v1/runtimes/{RUNTIME_1}/heartbeat", headers=keys.runtime_1)
    done, released, revoked, failed = [
        (await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)).json()["id"]
        for _ in range(4)]
    await reconcile()
    leases = {lease["taskId"]: lease for lease in (await client.get(
        f"/v1/runtimes/{RUNTIME_1}/leases", headers=keys.runtime_1)).json()["items"]}
    for task_id, outcome in ((done, "succeeded"), (released, "released"), (failed, "failed")):
        lease = leases[task_id]
        answer = await client.post(f"/v1/leases/{lease['id']}/complete", headers=keys.runtime_1,
                                   json={"outcome": outcome, "epoch": lease["epoch"]})
        assert answer.status_code == 200, answer.text
    # A preemption asks the runtime to stop: the lease goes REVOKING with its event.
    async with db.transaction() as conn:
        await conn.execute("UPDATE leases SET state = 'REVOKING', revoke_by = now() "
                           "WHERE id = $1", leases[revoked]["id"])
        await conn.execute("INSERT INTO task_events (task_id, from_state, to_state, reason) "
                           "VALUES ($1, 'LEASED', 'LEASED', 'revoking')", revoked)
    huge = await client.post("/v1/tasks", headers=keys.tenant_a, json=spec(
        requests={"cpuMillis": 400_000, "memoryMiB": 1, "llmSlots": 0}))
    await reconcile()
    cancelled = (await client.post("/v1/tasks", json=spec(), headers=keys.tenant_b)).json()["id"]
    await client.post(f"/v1/tasks/{cancelled}/cancel", headers=keys.tenant_b)
    for action in ("cordon", "activate", "drain"):
        answer = await client.post(f"/v1/pools/pool-a/{action}", headers=keys.operator_x)
        assert answer.status_code == 200, answer.text

    seen, _ = await drain(client, keys.admin)
    by: dict[str, list[str]] = {}
    for e in seen:
        by.setdefault(e.get("leaseId") or e.get("taskId") or e["poolId"], []).append(e["type"])
    assert by[done] == ["task.admitted", "task.leased", "task.succeeded"]
    assert by[leases[done]["id"]] == ["lease.granted", "lease.ended"]
    assert by[released][:3] == ["task.admitted", "task.leased", "task.requeued"]
    assert by[leases[released]["id"]] == ["lease.granted", "lease.ended"]
    assert by[revoked] == ["task.admitted", "task.leased", "task.revoking"]
    assert by[leases[revoked]["id"]] == ["lease.granted", "lease.revoking"]
    assert by[huge.json()["id"]] == ["task.admitted", "task.pending"]
    assert by[cancelled] == ["task.admitted", "task.cancelled"]
    assert by[failed] == ["task.admitted", "task.leased", "task.failed"]
    assert by["pool-a"] == ["pool.updated", "pool.updated", "pool.cordoned", "pool.activated",
                            "pool.draining"]
    ended = next(e for e in seen if e.get("leaseId") == leases[done]["id"]
                 and e["type"] == "lease.ended")
    assert ended["state"] == "COMPLETED" and ended["data"]["endReason"] == "succeeded"
    revoking = next(e for e in seen if e["type"] == "lease.revoking")
    assert revoking["state"] == "REVOKING" and revoking["data"]["revokeBy"].endswith("Z")
    assert set(EVENT_TYPES) - {e["type"] for e in seen} == set()
