"""GET /v1/queue: what is pending and why, scoped to what the caller may see."""

from __future__ import annotations

import httpx
from pydantic import TypeAdapter

from app.services.queue import QueueSummary
from tests.api.conftest import Keys, PoolMaker, assert_problem


def _spec(runtime_class: str) -> dict:
    return {"runtimeClass": runtime_class, "requests": {"cpuMillis": 100}}


async def _queue(client: httpx.AsyncClient, headers: dict[str, str]) -> dict:
    response = await client.get("/v1/queue", headers=headers)
    assert response.status_code == 200, response.text
    TypeAdapter(QueueSummary).validate_python(response.json())
    return response.json()


async def test_each_caller_sees_only_its_own_demand(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", tenant_ids=["tenant-a"], runtimeClass="gpu-small",
                    operators=["operator-x"])
    await pool_make("pool-y", tenant_ids=["tenant-b"], runtimeClass="cpu-big",
                    operators=["operator-y"])
    for headers, runtime_class in [
        (keys.tenant_a, "gpu-small"), (keys.tenant_a, "gpu-small"),
        (keys.tenant_b, "cpu-big"), (keys.tenant_b, "gpu-small"),
    ]:
        created = await client.post("/v1/tasks", json=_spec(runtime_class), headers=headers)
        assert created.status_code == 201

    mine = await _queue(client, keys.tenant_a)
    assert (mine["pending"], mine["byRuntimeClass"]) == (2, {"gpu-small": 2})
    assert mine["byReason"] == {"unexamined": 2}
    assert mine["items"] == [
        {"runtimeClass": "gpu-small", "code": "unexamined", "pending": 2, "parked": 0}]
    assert mine["oldestPendingSeconds"] >= 0 and mine["oldestPendingAt"] is not None

    theirs = await _queue(client, keys.tenant_b)
    assert theirs["byRuntimeClass"] == {"cpu-big": 1, "gpu-small": 1}

    # An operator sees the demand its pools could serve: pool-x takes tenant-a's gpu-small
    # tasks, not tenant-b's (pool-x does not list tenant-b).
    assert (await _queue(client, keys.operator_x))["byRuntimeClass"] == {"gpu-small": 2}
    assert (await _queue(client, keys.operator_y))["byRuntimeClass"] == {"cpu-big": 1}
    everything = await _queue(client, keys.admin)
    assert everything["pending"] == 4
    assert everything["byRuntimeClass"] == {"cpu-big": 1, "gpu-small": 3}

    # No answer names a pool or a tenant.
    for headers in (keys.tenant_a, keys.tenant_b, keys.operator_x, keys.admin):
        text = (await client.get("/v1/queue", headers=headers)).text
        assert "pool-" not in text and "tenant-" not in text


async def test_an_operator_without_pools_and_an_empty_queue(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    empty = await _queue(client, keys.operator_y)
    assert empty == {"pending": 0, "parked": 0, "byReason": {}, "byRuntimeClass": {},
                     "items": [], "oldestPendingAt": None, "oldestPendingSeconds": None}


async def test_a_runtime_key_is_refused_and_no_key_is_unauthorized(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    assert_problem(await client.get("/v1/queue", headers=keys.runtime_1), 403)
    assert_problem(await client.get("/v1/queue"), 401)
