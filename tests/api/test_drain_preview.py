"""Drain preview over a real HTTP server: where each leased task of a pool would go now, decided
as a pass decides (the moves it predicts are the ones a pass makes after the revoke), gangs as
a unit, nothing written, and who may ask."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from app.db import Database
from app.ledger.leases import pool_leases_revoke
from tests.api.conftest import Keys, assert_problem, pool_body

REQUESTS = {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1}
ONE_TASK = {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1}
THREE_TASKS = {"cpuMillis": 3000, "memoryMiB": 3072, "llmSlots": 3}


async def _pool(live: httpx.AsyncClient, keys: Keys, pool_id: str, capacity: dict[str, int],
                **fields: Any) -> None:
    created = await live.post("/v1/pools", json=pool_body(pool_id, **fields), headers=keys.admin)
    assert created.status_code == 201, created.text
    put = await live.put(f"/v1/pools/{pool_id}/capacity", json=capacity, headers=keys.admin)
    assert put.status_code == 200, put.text


async def _submit(live: httpx.AsyncClient, keys: Keys, **spec: Any) -> str:
    body = {"runtimeClass": "gpu-small", "requests": REQUESTS, **spec}
    response = await live.post("/v1/tasks", json=body, headers=keys.tenant_a)
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def _task(live: httpx.AsyncClient, keys: Keys, task_id: str) -> dict[str, Any]:
    response = await live.get(f"/v1/tasks/{task_id}", headers=keys.tenant_a)
    assert response.status_code == 200, response.text
    return response.json()


async def _ledger(live: httpx.AsyncClient, keys: Keys) -> list[tuple[str, Any, str]]:
    pools = (await live.get("/v1/pools", headers=keys.admin)).json()["items"]
    return [(p["id"], p["reserved"], p["status"]) for p in pools]


async def test_preview_predicts_the_moves_a_pass_makes_after_the_revoke(
    live: httpx.AsyncClient, keys: Keys, reconcile, db: Database
) -> None:
    # The three tasks land on pool-x, the only pool then; once it drains, pool-y (cheaper
    # than pool-z) has room for one, pool-z for one, and the third fits nowhere.
    await _pool(live, keys, "pool-x", THREE_TASKS)
    await live.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    tasks = [await _submit(live, keys) for _ in range(3)]
    assert (await reconcile()).leased == 3
    await _pool(live, keys, "pool-y", ONE_TASK, costWeight=1.0, failureDomain="fd-2")
    await _pool(live, keys, "pool-z", ONE_TASK, costWeight=2.0, failureDomain="fd-3")
    leases = {t: (await _task(live, keys, t))["lease"]["id"] for t in tasks}
    before = await _ledger(live, keys)

    response = await live.post("/v1/pools/pool-x/drain-preview", headers=keys.operator_x)

    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [(i["taskId"], i["leaseId"]) for i in items] == [(t, leases[t]) for t in tasks]
    assert [i["poolId"] for i in items] == ["pool-y", "pool-z", None]
    assert [i["members"] for i in items[:2]] == [
        [{"poolId": "pool-y", "count": 1}], [{"poolId": "pool-z", "count": 1}]
    ]
    assert all(i["tenantId"] == "tenant-a" for i in items)
    assert items[0]["reason"] is None
    waiting = items[2]["reason"]
    assert waiting["code"] == "insufficient_cpu", waiting
    assert waiting["message"] and waiting["rejections"]
    # Nothing reserved, nothing changed.
    assert await _ledger(live, keys) == before
    assert [(await _task(live, keys, t))["state"] for t in tasks] == ["LEASED"] * 3

    # The real thing: drain, revoke the leases, one pass. It does what the preview said.
    assert (await live.post("/v1/pools/pool-x/drain", headers=keys.operator_x)).status_code == 200
    async with db.transaction() as conn:
        assert await pool_leases_revoke(conn, pool_id="pool-x", now=datetime.now(UTC)) == 3
    assert (await reconcile()).leased == 2
    after = [await _task(live, keys, t) for t in tasks]
    assert [t["lease"]["poolId"] if t["lease"] else None for t in after] == [
        "pool-y", "pool-z", None
    ]
    assert after[2]["pendingReason"]["code"] == waiting["code"]


async def test_a_gang_moves_as_a_unit_and_gives_back_what_it_holds_elsewhere(
    live: httpx.AsyncClient, keys: Keys, reconcile
) -> None:
    # The gang takes pool-a and pool-b, one member each (the only pools then). With pool-a
    # draining it needs two other pools: pool-b only has room because the gang itself
    # gives back its member there, and pool-c is the other.
    await _pool(live, keys, "pool-a", ONE_TASK)
    await _pool(live, keys, "pool-b", ONE_TASK, failureDomain="fd-2")
    await live.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    gang = await _submit(live, keys, gang={"members": 2, "maxPerPool": 1})
    assert (await reconcile()).leased == 1
    await _pool(live, keys, "pool-c", ONE_TASK, failureDomain="fd-3")
    assert {m["poolId"] for m in (await _task(live, keys, gang))["placement"]["members"]} == {
        "pool-a", "pool-b"
    }

    response = await live.post("/v1/pools/pool-a/drain-preview", headers=keys.operator_x)

    assert response.status_code == 200, response.text
    (item,) = response.json()["items"]
    assert item["taskId"] == gang and item["reason"] is None
    assert sorted((m["poolId"], m["count"]) for m in item["members"]) == [
        ("pool-b", 1), ("pool-c", 1)
    ]
    assert item["poolId"] == item["members"][0]["poolId"]


async def test_a_task_on_its_last_attempt_would_fail(
    live: httpx.AsyncClient, keys: Keys, reconcile
) -> None:
    await _pool(live, keys, "pool-x", ONE_TASK)
    await live.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    await _submit(live, keys, maxAttempts=1)
    assert (await reconcile()).leased == 1
    await _pool(live, keys, "pool-y", ONE_TASK, failureDomain="fd-2")

    response = await live.post("/v1/pools/pool-x/drain-preview", headers=keys.admin)

    (item,) = response.json()["items"]
    assert item["poolId"] is None and item["members"] == []
    assert item["reason"]["code"] == "attempts_exhausted"
    assert "last attempt (1 of 1)" in item["reason"]["message"]


async def test_a_pool_without_leases_previews_nothing(
    live: httpx.AsyncClient, keys: Keys
) -> None:
    await _pool(live, keys, "pool-x", ONE_TASK)

    response = await live.post("/v1/pools/pool-x/drain-preview", headers=keys.operator_x)

    assert response.status_code == 200, response.text
    assert response.json() == {
        "summary": {"leases": 0, "placed": 0, "waiting": 0, "destinations": [],
                    "toPoolsNotShown": 0, "waitingByReason": []},
        "items": [],
        "nextCursor": None,
    }


async def test_the_summary_counts_every_lease_and_items_come_in_pages(
    live: httpx.AsyncClient, keys: Keys, reconcile
) -> None:
    # Five tasks on pool-x; once it drains, pool-y has room for three, the other two wait.
    await _pool(live, keys, "pool-x", {k: v * 5 for k, v in ONE_TASK.items()})
    await live.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    tasks = [await _submit(live, keys) for _ in range(5)]
    assert (await reconcile()).leased == 5
    await _pool(live, keys, "pool-y", THREE_TASKS, failureDomain="fd-2")

    first = await live.post("/v1/pools/pool-x/drain-preview?limit=2", headers=keys.operator_x)

    assert first.status_code == 200, first.text
    page = first.json()
    assert page["summary"] == {
        "leases": 5, "placed": 3, "waiting": 2,
        "destinations": [{"poolId": "pool-y", "leases": 3}], "toPoolsNotShown": 0,
        "waitingByReason": [{"code": "insufficient_cpu", "leases": 2}],
    }
    items = page["items"]
    while page["nextCursor"]:
        page = (await live.post(
            f"/v1/pools/pool-x/drain-preview?limit=2&cursor={page['nextCursor']}",
            headers=keys.operator_x,
        )).json()
        assert len(page["items"]) <= 2
        items += page["items"]
    assert [i["taskId"] for i in items] == tasks
    # A cursor of another pool's preview, or one Berth did not make, is refused.
    await _pool(live, keys, "pool-z", ONE_TASK, failureDomain="fd-3")
    cursor = first.json()["nextCursor"]
    assert_problem(await live.post(f"/v1/pools/pool-z/drain-preview?cursor={cursor}",
                                   headers=keys.operator_x), 400)
    assert_problem(await live.post("/v1/pools/pool-x/drain-preview?cursor=xyz",
                                   headers=keys.operator_x), 400)


async def test_a_destination_the_caller_cannot_see_is_counted_never_named(
    live: httpx.AsyncClient, keys: Keys, reconcile
) -> None:
    # operator-x operates pool-x only; pool-t lists tenant-a and has no operator: an
    # operator of pool-x gets 404 for it, so the preview must not name it to that operator.
    await _pool(live, keys, "pool-x", ONE_TASK)
    await live.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    task = await _submit(live, keys)
    assert (await reconcile()).leased == 1
    await _pool(live, keys, "pool-t", ONE_TASK, operators=[], failureDomain="fd-2")
    assert_problem(await live.get("/v1/pools/pool-t", headers=keys.operator_x), 404)

    seen = await live.post("/v1/pools/pool-x/drain-preview", headers=keys.operator_x)

    assert seen.status_code == 200, seen.text
    assert "pool-t" not in seen.text
    (item,) = seen.json()["items"]
    assert item["taskId"] == task and item["reason"] is None
    assert (item["poolId"], item["members"], item["membersElsewhere"]) == (None, [], 1)
    summary = seen.json()["summary"]
    assert (summary["placed"], summary["destinations"], summary["toPoolsNotShown"]) == (1, [], 1)
    # An admin sees every pool: the same move, named.
    admin = (await live.post("/v1/pools/pool-x/drain-preview", headers=keys.admin)).json()
    assert admin["items"][0]["poolId"] == "pool-t"
    assert admin["summary"]["destinations"] == [{"poolId": "pool-t", "leases": 1}]


@pytest.mark.parametrize(
    ("caller", "status"),
    [
        pytest.param("admin", 200, id="admin"),
        pytest.param("operator_x", 200, id="its-operator"),
        pytest.param("operator_y", 404, id="another-operator-cannot-see-it"),
        pytest.param("tenant_a", 403, id="a-tenant-it-lists"),
        pytest.param("tenant_b", 404, id="a-tenant-it-does-not-list"),
        pytest.param("runtime_1", 403, id="its-runtime"),
        pytest.param("runtime_2", 404, id="another-runtime"),
    ],
)
async def test_only_the_pools_operators_and_admins_may_preview(
    live: httpx.AsyncClient, keys: Keys, caller: str, status: int
) -> None:
    await _pool(live, keys, "pool-x", ONE_TASK)

    response = await live.post("/v1/pools/pool-x/drain-preview", headers=keys[caller])

    if status == 200:
        assert response.status_code == 200, response.text
    else:
        problem = assert_problem(response, status)
        assert "tenant" not in problem["detail"]


async def test_unknown_pool_and_no_key(live: httpx.AsyncClient, keys: Keys) -> None:
    assert_problem(await live.post("/v1/pools/nope/drain-preview", headers=keys.admin), 404)
    assert_problem(await live.post("/v1/pools/nope/drain-preview"), 401)
