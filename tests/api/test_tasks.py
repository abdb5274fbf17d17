"""Tasks API: submit, get, list (cursor, filters), events, cancel, tenant isolation, errors."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.task_schemas import Task, TaskEvent
from app.ledger.keys import api_key_create

SPEC: dict[str, Any] = {
    "runtimeClass": "gpu-small",
    "requests": {"cpuMillis": 500, "memoryMiB": 256, "llmSlots": 1},
    "labels": {"app": "web"},
}


def spec(**fields: Any) -> dict[str, Any]:
    """Return a valid task spec with ``fields`` (camelCase) overriding the defaults."""
    return {**SPEC, **fields}


async def submit(client: httpx.AsyncClient, headers: dict[str, str], **fields: Any) -> dict:
    """Submit a task and return its JSON, asserting 201."""
    r = await client.post("/v1/tasks", json=spec(**fields), headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


async def test_submit_stores_an_admitted_task_with_location(client, keys, db: AsyncEngine):
    r = await client.post("/v1/tasks", json=spec(priority=7, maxAttempts=5), headers=keys.tenant_a)
    assert r.status_code == 201, r.text
    task = r.json()
    Task.model_validate(task)
    assert r.headers["location"] == f"/v1/tasks/{task['id']}"
    assert task["state"] == "ADMITTED"
    assert task["tenantId"] == "tenant-a"
    assert (task["priority"], task["maxAttempts"], task["attempts"]) == (7, 5, 0)
    assert task["spec"]["requests"] == {"cpuMillis": 500, "memoryMiB": 256, "llmSlots": 1}
    assert task["spec"]["labels"] == {"app": "web"}
    assert task["placement"] is None and task["lease"] is None and task["leases"] == []
    async with db.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT shard, runtime_class, labels, state FROM tasks WHERE id = :id"),
                {"id": uuid.UUID(task["id"])},
            )
        ).one()
    from app.shards import shard_of

    assert row.shard == shard_of("tenant-a")
    assert (row.runtime_class, row.labels, row.state) == ("gpu-small", {"app": "web"}, "ADMITTED")
    got = await client.get(r.headers["location"], headers=keys.tenant_a)
    assert got.status_code == 200
    assert got.json() == task


async def test_submit_records_the_admitted_event(client, keys):
    task = await submit(client, keys.tenant_a)
    r = await client.get(f"/v1/tasks/{task['id']}/events", headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["nextCursor"] is None
    [event] = page["items"]
    TaskEvent.model_validate(event)
    assert (event["fromState"], event["toState"]) == (None, "ADMITTED")
    assert event["reason"] == "submitted"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        pytest.param(spec(colour="red"), "colour", id="unknown-top-level-field"),
        pytest.param(spec(requests={"cpuMillis": 1, "gpus": 1}), "gpus", id="unknown-nested"),
        pytest.param(spec(requests={"cpuMillis": -1}), "cpuMillis", id="negative-request"),
        pytest.param(spec(requests={"cpuMillis": 0}), "requests", id="all-zero-requests"),
        pytest.param(spec(runtimeClass="Not A Class!"), "runtimeClass", id="bad-runtime-class"),
        pytest.param(spec(gang={"members": 0}), "members", id="empty-gang"),
        pytest.param({"requests": {"cpuMillis": 1}}, "runtimeClass", id="missing-runtime-class"),
    ],
)
async def test_invalid_specs_are_422_problems_and_never_stored(client, keys, body, where):
    r = await client.post("/v1/tasks", json=body, headers=keys.tenant_a)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["status"] == 422
    assert any(where in ".".join(map(str, e["loc"])) or where in e["msg"]
               for e in problem["errors"]), problem
    listed = await client.get("/v1/tasks", headers=keys.tenant_a)
    assert listed.json()["items"] == []


async def test_malformed_json_is_a_4xx_problem(client, keys):
    r = await client.post(
        "/v1/tasks",
        content=b"{not json",
        headers={**keys.tenant_a, "content-type": "application/json"},
    )
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")


@pytest.mark.parametrize("role", ["admin", "operator_x", "runtime_1"])
async def test_only_tenants_submit(client, keys, role):
    r = await client.post("/v1/tasks", json=spec(), headers=keys[role])
    assert r.status_code == 403
    assert r.json()["status"] == 403


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer berth_wrong"}, {"Authorization": "Basic abc"}],
    ids=["missing", "unknown-key", "wrong-scheme"],
)
async def test_missing_or_wrong_key_is_401(client, keys, headers):
    for method, path in [("POST", "/v1/tasks"), ("GET", "/v1/tasks"),
                         ("GET", f"/v1/tasks/{uuid.uuid4()}")]:
        r = await client.request(method, path, json=spec(), headers=headers)
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")


async def test_another_tenants_task_is_not_found(client, keys):
    task = await submit(client, keys.tenant_a)
    for path in (f"/v1/tasks/{task['id']}", f"/v1/tasks/{task['id']}/events"):
        r = await client.get(path, headers=keys.tenant_b)
        assert r.status_code == 404, r.text
        missing = await client.get(path.replace(task["id"], str(uuid.uuid4())),
                                   headers=keys.tenant_b)
        # Indistinguishable from a task that does not exist.
        assert r.json() == missing.json()
    r = await client.post(f"/v1/tasks/{task['id']}/cancel", headers=keys.tenant_b)
    assert r.status_code == 404
    assert (await client.get("/v1/tasks", headers=keys.tenant_b)).json()["items"] == []
    still = await client.get(f"/v1/tasks/{task['id']}", headers=keys.tenant_a)
    assert still.json()["state"] == "ADMITTED"


@pytest.mark.parametrize("task_id", ["not-a-uuid", "1234", "%20"])
async def test_malformed_task_ids_are_404(client, keys, task_id):
    r = await client.get(f"/v1/tasks/{task_id}", headers=keys.tenant_a)
    assert r.status_code == 404
    assert r.json()["type"].endswith("task-not-found")


async def test_list_pages_in_admission_order_with_filters(client, keys):
    ids = [(await submit(client, keys.tenant_a,
                         runtimeClass="gpu-small" if i % 2 == 0 else "cpu-large"))["id"]
           for i in range(7)]
    await submit(client, keys.tenant_b)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = await client.get("/v1/tasks", params=params, headers=keys.tenant_a)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [t["id"] for t in page["items"]]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == ids and pages == 3

    r = await client.get("/v1/tasks", params={"runtimeClass": "cpu-large"}, headers=keys.tenant_a)
    assert [t["id"] for t in r.json()["items"]] == ids[1::2]
    r = await client.get("/v1/tasks", params={"state": "ADMITTED", "limit": 500},
                         headers=keys.tenant_a)
    assert len(r.json()["items"]) == 7
    r = await client.get("/v1/tasks", params={"state": "LEASED"}, headers=keys.tenant_a)
    assert r.json()["items"] == []


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"limit": 0}, 422),
        ({"limit": 501}, 422),
        ({"state": "SLEEPING"}, 422),
        ({"cursor": "!!!"}, 400),
        ({"cursor": "InRleHQi"}, 400),  # a valid encoding of a string, not a position
    ],
    ids=["limit-0", "limit-501", "unknown-state", "garbage-cursor", "foreign-cursor"],
)
async def test_bad_list_parameters_are_problems(client, keys, params, status):
    r = await client.get("/v1/tasks", params=params, headers=keys.tenant_a)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")


async def test_cancel_an_admitted_task_then_again_is_409(client, keys):
    task = await submit(client, keys.tenant_a)
    r = await client.post(f"/v1/tasks/{task['id']}/cancel", headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "CANCELLED"
    again = await client.post(f"/v1/tasks/{task['id']}/cancel", headers=keys.tenant_a)
    assert again.status_code == 409
    events = (await client.get(f"/v1/tasks/{task['id']}/events", headers=keys.tenant_a)).json()
    assert [e["toState"] for e in events["items"]] == ["ADMITTED", "CANCELLED"]


async def test_a_multi_tenant_key_names_its_tenant(client, keys, db: AsyncEngine):
    async with db.begin() as conn:
        raw = await api_key_create(conn, role="tenant", subject="platform",
                                   tenant_ids=["tenant-a", "tenant-c"])
    both = {"Authorization": f"Bearer {raw}"}
    r = await client.post("/v1/tasks", json=spec(), headers=both)
    assert r.status_code == 400
    assert "X-Berth-Tenant" in r.json()["detail"]
    r = await client.post("/v1/tasks", json=spec(), headers={**both, "X-Berth-Tenant": "tenant-b"})
    assert r.status_code == 400
    r = await client.post("/v1/tasks", json=spec(), headers={**both, "X-Berth-Tenant": "tenant-c"})
    assert r.status_code == 201
    assert r.json()["tenantId"] == "tenant-c"
    a = await submit(client, keys.tenant_a)
    listed = (await client.get("/v1/tasks", headers=both)).json()["items"]
    assert {t["tenantId"] for t in listed} == {"tenant-a", "tenant-c"}
    only_c = (await client.get("/v1/tasks", headers={**both, "X-Berth-Tenant": "tenant-c"})).json()
    assert [t["tenantId"] for t in only_c["items"]] == ["tenant-c"]
    r = await client.get(f"/v1/tasks/{a['id']}", headers={**both, "X-Berth-Tenant": "tenant-c"})
    assert r.status_code == 404


async def test_a_nul_character_in_a_spec_is_422_not_500(client, keys):
    r = await client.post("/v1/tasks", json=spec(labels={"app": "a\x00b"}), headers=keys.tenant_a)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "NUL" in r.json()["detail"]


async def test_cursors_from_other_lists_or_out_of_range_are_400(client, keys):
    from app.api.common import cursor_encode

    for position in (-1, 2**63, True, [1, 2]):
        r = await client.get("/v1/tasks", params={"cursor": cursor_encode(position)},
                             headers=keys.tenant_a)
        assert r.status_code == 400, (position, r.text)
