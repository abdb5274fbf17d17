"""POST /v1/replays: admin only; one window; a bad profile is 422 naming what is wrong; the
pass of a placed task replays identically."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import Keys, assert_problem, pool_body

REQUESTS = {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1}


async def _placed(client: httpx.AsyncClient, keys: Keys, reconcile: Any) -> str:
    created = await client.post("/v1/pools", json=pool_body("pool-r"), headers=keys.admin)
    assert created.status_code == 201, created.text
    put = await client.put("/v1/pools/pool-r/capacity",
                           json={"cpuMillis": 4000, "memoryMiB": 4096, "llmSlots": 4},
                           headers=keys.admin)
    assert put.status_code == 200, put.text
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    task = await client.post("/v1/tasks", json={"runtimeClass": "gpu-small",
                                                 "requests": REQUESTS}, headers=keys.tenant_a)
    assert task.status_code == 201, task.text
    assert (await reconcile()).leased == 1
    return task.json()["id"]


async def test_the_pass_of_a_placed_task_replays_identically(
    client: httpx.AsyncClient, keys: Keys, reconcile: Any
) -> None:
    task_id = await _placed(client, keys, reconcile)
    answer = await client.post("/v1/replays", json={"taskId": task_id}, headers=keys.admin)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["passes"], body["decisions"], body["identical"], body["changed"]) == (
        1, 1, 1, [])
    assert body["summary"]["cascade"] is False and len(body["summary"]["passIds"]) == 1
    by_pass = await client.post("/v1/replays", json={"passIds": body["summary"]["passIds"]},
                                headers=keys.admin)
    assert by_pass.json()["identical"] == 1
    recent = await client.post("/v1/replays", json={"since": "10m"}, headers=keys.admin)
    assert recent.status_code == 200 and recent.json()["passes"] >= 1


async def test_replays_are_for_admins(client: httpx.AsyncClient, keys: Keys) -> None:
    for who in ("tenant_a", "operator_x", "runtime_1"):
        response = await client.post("/v1/replays", json={"since": "10m"}, headers=keys[who])
        assert_problem(response, 403)


@pytest.mark.parametrize("body", [
    {}, {"since": "10m", "passIds": ["a/1"]}, {"since": "ten minutes"}, {"since": 600},
    {"passIds": []}, {"taskId": "not-a-uuid"}, {"since": "10m", "extra": 1},
], ids=["none", "two", "words", "number", "empty", "uuid", "unknown"])
async def test_a_window_is_exactly_one_of_since_pass_ids_task_id(
    client: httpx.AsyncClient, keys: Keys, body: dict
) -> None:
    assert_problem(await client.post("/v1/replays", json=body, headers=keys.admin), 422)


async def test_a_bad_profile_is_422_naming_what_is_wrong(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    profile = {"strategy": "spread", "filters": ["capacity"],
               "scores": [{"name": "cost", "weight": -1}]}
    response = await client.post("/v1/replays", json={"since": "10m", "profile": profile},
                                 headers=keys.admin)
    assert "weight must be a positive integer" in assert_problem(response, 422)["detail"]


async def test_an_unknown_task_is_404(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post("/v1/replays",
                                 json={"taskId": "00000000-0000-7000-8000-000000000000"},
                                 headers=keys.admin)
    assert_problem(response, 404)
