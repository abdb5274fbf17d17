"""Tasks API: submit, get, list (cursor, filters), events, cancel, tenant isolation, errors."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Header, Path
from pydantic import TypeAdapter

from app.api.bodies import StrictRoute
from app.api.task_schemas import Task, TaskEvent
from app.auth import TenantDep
from app.db import Database
from app.ledger.keys import api_key_create
from app.scheduling.spec import TaskSpec
from app.services.tenancy import tenant_acting, tenants_reading
from tests.api.conftest import assert_problem

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


async def test_submit_stores_an_admitted_task_with_location(client, keys, db: Database):
    r = await client.post("/v1/tasks", json=spec(priority=7, maxAttempts=5), headers=keys.tenant_a)
    assert r.status_code == 201, r.text
    task = r.json()
    TypeAdapter(Task).validate_python(task)
    assert r.headers["location"] == f"/v1/tasks/{task['id']}"
    assert task["state"] == "ADMITTED"
    assert task["tenantId"] == "tenant-a"
    assert (task["priority"], task["maxAttempts"], task["attempts"]) == (7, 5, 0)
    assert task["spec"]["requests"] == {"cpuMillis": 500, "memoryMiB": 256, "llmSlots": 1}
    assert task["spec"]["labels"] == {"app": "web"}
    assert task["placement"] is None and task["lease"] is None and task["leases"] == []
    async with db.connection() as conn:
        row = await conn.fetchrow(
            "SELECT shard, runtime_class, labels, state FROM tasks WHERE id = $1",
            uuid.UUID(task["id"]),
        )
    from app.shards import shard_of

    assert row["shard"] == shard_of("tenant-a")
    assert (row["runtime_class"], row["labels"], row["state"]) == (
        "gpu-small", {"app": "web"}, "ADMITTED")
    got = await client.get(r.headers["location"], headers=keys.tenant_a)
    assert got.status_code == 200
    # Read alone, an admitted task also says where it stands (not examined yet: no ETA).
    assert got.json() == {**task, "queue": {
        "position": 1, "competing": 1, "exact": True, "policy": "fifo",
        "estimatedStartAt": None,
        "estimate": "no estimate: not examined yet; a reconciler pass looks at it next",
    }}


async def test_submit_records_the_admitted_event(client, keys):
    task = await submit(client, keys.tenant_a)
    r = await client.get(f"/v1/tasks/{task['id']}/events", headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["nextCursor"] is None
    [event] = page["items"]
    TypeAdapter(TaskEvent).validate_python(event)
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


async def test_malformed_json_is_a_400_problem(client, keys):
    r = await client.post(
        "/v1/tasks",
        content=b"{not json",
        headers={**keys.tenant_a, "content-type": "application/json"},
    )
    assert assert_problem(r, 400)["type"] == "https://berth.dev/problems/malformed-body"


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


async def test_a_multi_tenant_key_names_its_tenant(client, keys, db: Database):
    async with db.transaction() as conn:
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
    import base64

    import orjson

    for position in (-1, 2**63, True, [1, 2]):
        forged = base64.urlsafe_b64encode(orjson.dumps(position)).decode().rstrip("=")
        r = await client.get("/v1/tasks", params={"cursor": forged},
                             headers=keys.tenant_a)
        assert r.status_code == 400, (position, r.text)


# --- createTask and getTask are lean routes: they answer exactly as a Depends route would ---


async def new_tenant_key(db: Database, *tenants: str) -> dict[str, str]:
    async with db.transaction() as conn:
        raw = await api_key_create(conn, role="tenant", subject="t", tenant_ids=list(tenants))
    return {"Authorization": f"Bearer {raw}"}


async def test_uncached_and_cached_keys_submit_alike(client, keys, db: Database):
    headers = {**await new_tenant_key(db, "tenant-a"), "Idempotency-Key": "k-1"}
    first = await client.post("/v1/tasks", json=SPEC, headers=headers)  # verifies the key
    again = await client.post("/v1/tasks", json=SPEC, headers=headers)  # from the key cache
    other = await client.post("/v1/tasks", json=SPEC, headers={**headers, "Idempotency-Key": "2"})

    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"] == "application/json"
    assert other.headers["location"] == f"/v1/tasks/{other.json()['id']}"
    assert set(other.json()) == set(first.json())


async def test_uncached_and_cached_keys_read_alike(client, keys, db: Database):
    task = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()
    fresh = await new_tenant_key(db, "tenant-a")
    uncached = await client.get(f"/v1/tasks/{task['id']}", headers=fresh)
    cached = await client.get(f"/v1/tasks/{task['id']}", headers=fresh)

    assert uncached.status_code == cached.status_code == 200
    assert cached.json() == uncached.json() == {
        **task, "updatedAt": uncached.json()["updatedAt"], "queue": uncached.json()["queue"]}
    assert uncached.json()["queue"]["position"] == 1
    assert cached.headers["content-type"] == uncached.headers["content-type"]


_TenantHeader = Annotated[str | None, Header(alias="X-Berth-Tenant", max_length=128)]
_KeyHeader = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=255)]
_TaskId = Annotated[str, Path(alias="taskId")]


def oracle_routes(app: FastAPI) -> None:
    """Add the regular (Depends) declarations of createTask and getTask under /v1/oracle."""

    async def create(
        spec: TaskSpec, principal: TenantDep, idempotency_key: _KeyHeader = None,
        tenant: _TenantHeader = None,
    ) -> dict[str, Any]:
        tenant_acting(principal, tenant)
        return {"accepted": True}

    async def get(task_id: _TaskId, principal: TenantDep, tenant: _TenantHeader = None):
        tenants_reading(principal, tenant)
        return {"read": True}

    app.router.add_api_route(
        "/v1/oracle/tasks", create, methods=["POST"], route_class_override=StrictRoute
    )
    app.router.add_api_route(
        "/v1/oracle/tasks/{taskId}", get, methods=["GET"], route_class_override=StrictRoute
    )


async def test_refusals_are_those_of_a_regular_route_and_store_nothing(
    app: FastAPI, client, keys, db: Database
):
    oracle_routes(app)
    both = await new_tenant_key(db, "tenant-a", "tenant-c")
    body = orjson.dumps(SPEC)
    plain = {**keys.tenant_a, "Content-Type": "application/json"}
    cases: list[tuple[dict[str, str], bytes, int]] = [
        ({"Content-Type": "application/json"}, body, 401),  # no key
        ({"Authorization": "Bearer not-a-key", "Content-Type": "application/json"}, body, 401),
        ({"Authorization": "Basic abc", "Content-Type": "application/json"}, body, 401),
        ({**keys.admin, "Content-Type": "application/json"}, body, 403),  # not a tenant key
        ({**keys.tenant_a}, body, 415),  # no content type
        ({**keys.tenant_a, "Content-Type": "text/plain"}, body, 415),
        ({**both, "Content-Type": "application/json"}, body, 400),  # which tenant?
        ({**plain, "X-Berth-Tenant": "tenant-b"}, body, 400),  # not its tenant
        ({**plain, "X-Berth-Tenant": "t" * 129}, body, 422),
        ({**plain, "Idempotency-Key": "k" * 256}, body, 422),
        ({**plain, "Idempotency-Key": ""}, body, 422),
        ({**plain, "X-Berth-Tenant": "t" * 129}, orjson.dumps({**SPEC, "x": 1}), 422),
        (plain, b"", 422),
        (plain, b"{not json", 400),
        ({"Content-Type": "application/json"}, b"{not json", 401),  # no key: body unread
        ({"Content-Type": "text/plain"}, body, 401),  # no key: body unread
        (plain, b"\xff\xfe{", 400),
        (plain, b'{"runtimeClass": "a", "runtimeClass": "b"}', 400),
        (plain, orjson.dumps({**SPEC, "unknown": 1}), 422),
        (plain, orjson.dumps({**SPEC, "requests": {"cpuMillis": "500"}}), 422),
        (plain, b"[]", 422),
        ({**keys.tenant_a, "Content-Type": "application/vnd.berth+json"}, body, 415),
        ({**keys.tenant_a, "Content-Type": "application/json; charset=UTF-8"}, body, 201),
    ]
    for headers, content, status in cases:
        answer = await client.post("/v1/tasks", content=content, headers=headers)
        oracle = await client.post("/v1/oracle/tasks", content=content, headers=headers)
        assert answer.status_code == status, (headers, content, answer.text)
        if status >= 400:
            assert_problem(answer, status)
            assert (answer.status_code, answer.json()) == (oracle.status_code, oracle.json()), (
                headers, content)
        else:
            assert oracle.status_code == 200, oracle.text
    for task_id, headers, status in [
        ("not-a-uuid", keys.tenant_a, 404),
        ("0" * 65, keys.tenant_a, 404),
        ("0" * 65, {**keys.tenant_a, "X-Berth-Tenant": "t" * 129}, 422),
        ("7d1c6f3e-0c1a-4c1e-9a57-3a2b1c0d9e8f", keys.admin, 403),
        ("7d1c6f3e-0c1a-4c1e-9a57-3a2b1c0d9e8f", {}, 401),
        ("7d1c6f3e-0c1a-4c1e-9a57-3a2b1c0d9e8f", {**keys.tenant_a, "X-Berth-Tenant": "tenant-b"},
         400),
    ]:
        answer = await client.get(f"/v1/tasks/{task_id}", headers=headers)
        assert answer.status_code == status, (task_id, answer.text)
        if status != 404:
            oracle = await client.get(f"/v1/oracle/tasks/{task_id}", headers=headers)
            assert answer.json() == oracle.json(), task_id
    listed = await client.get("/v1/tasks", headers=keys.tenant_a)
    assert len(listed.json()["items"]) == 1, "only the one valid submission was stored"


async def test_a_chunked_body_is_read_whole(client, keys):
    async def chunks():
        yield b'{"runtimeClass": "gpu-small", '
        yield b'"requests": {"cpuMillis": -1}}'

    chunked = await client.post(
        "/v1/tasks", content=chunks(),
        headers={**keys.tenant_a, "Content-Type": "application/json"},
    )
    assert any(e["loc"][-1] == "cpuMillis" for e in assert_problem(chunked, 422)["errors"])
    unknown = await client.post("/v1/tasks", json={**SPEC, "bogus": 1}, headers=keys.tenant_a)
    assert ["body", "bogus"] in [e["loc"] for e in assert_problem(unknown, 422)["errors"]]


async def test_submit_and_read_errors_are_the_regular_problems(client, keys):
    task = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()
    reused = await client.post(
        "/v1/tasks", json=SPEC, headers={**keys.tenant_a, "Idempotency-Key": "same"}
    )
    reused_other = await client.post(
        "/v1/tasks",
        json={**SPEC, "priority": 7},
        headers={**keys.tenant_a, "Idempotency-Key": "same"},
    )
    foreign = await client.get(f"/v1/tasks/{task['id']}", headers=keys.tenant_b)
    missing = await client.get(
        "/v1/tasks/7d1c6f3e-0c1a-4c1e-9a57-3a2b1c0d9e8f", headers=keys.tenant_a
    )
    assert reused.status_code == 201
    assert assert_problem(reused_other, 409)["type"].endswith("idempotency-key-reused")
    assert assert_problem(foreign, 404) == assert_problem(missing, 404)


async def test_metrics_label_requests_by_their_route(client, keys):
    task = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()
    assert (await client.get(f"/v1/tasks/{task['id']}", headers=keys.tenant_a)).status_code == 200

    metrics = (await client.get("/metrics")).text

    assert 'handler="/v1/tasks/{taskId}"' in metrics
    assert 'handler="/v1/tasks"' in metrics
    assert task["id"] not in metrics
