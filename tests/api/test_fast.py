"""Fast paths of task submit and read: they answer only the plain case, exactly as the routes do.

A key is verified (and cached) by its first request, which the regular route answers; later
requests with it take the fast path when everything else is plain too.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.fast import get_fast, submit_fast
from app.ledger.keys import api_key_create
from tests.api.conftest import PROBLEM_JSON, Keys, assert_problem

SPEC: dict[str, Any] = {
    "runtimeClass": "gpu-small",
    "requests": {"cpuMillis": 500, "memoryMiB": 256},
    "labels": {"app": "web"},
}


async def asgi_call(
    handler: Any,
    app: FastAPI,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"",
    path_params: dict[str, str] | None = None,
) -> tuple[bool, list[dict[str, Any]]]:
    """Call a fast-path handler directly; return whether it answered and what it sent."""
    scope = {
        "type": "http",
        "app": app,
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "path_params": path_params or {},
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return await handler(scope, receive, send), sent


async def warm(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    """Make one request with a key so that it is verified and cached (non-tenants get 403)."""
    assert (await client.get("/v1/tasks", headers=headers)).status_code in (200, 403)


async def new_tenant_key(db: AsyncEngine, *tenants: str) -> dict[str, str]:
    async with db.begin() as conn:
        raw = await api_key_create(conn, role="tenant", subject="t", tenant_ids=list(tenants))
    return {"Authorization": f"Bearer {raw}"}


async def test_fast_and_regular_submissions_answer_alike(client, keys: Keys, db: AsyncEngine):
    headers = {**await new_tenant_key(db, "tenant-a"), "Idempotency-Key": "k-1"}
    first = await client.post("/v1/tasks", json=SPEC, headers=headers)  # verifies the key
    again = await client.post("/v1/tasks", json=SPEC, headers=headers)  # the fast path
    other = await client.post("/v1/tasks", json=SPEC, headers={**headers, "Idempotency-Key": "2"})

    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"] == "application/json"
    assert other.headers["location"] == f"/v1/tasks/{other.json()['id']}"
    assert set(other.json()) == set(first.json())


async def test_fast_and_regular_reads_answer_alike(client, keys: Keys, db: AsyncEngine):
    task = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()
    fresh = await new_tenant_key(db, "tenant-a")
    regular = await client.get(f"/v1/tasks/{task['id']}", headers=fresh)
    fast = await client.get(f"/v1/tasks/{task['id']}", headers=fresh)

    assert regular.status_code == fast.status_code == 200
    assert fast.json() == regular.json() == {**task, "updatedAt": regular.json()["updatedAt"]}
    assert fast.headers["content-type"] == regular.headers["content-type"]


async def test_the_fast_paths_answer_plain_requests(app: FastAPI, client, keys: Keys):
    await warm(client, keys.tenant_a)
    json_headers = {**keys.tenant_a, "Content-Type": "application/json"}

    handled, sent = await asgi_call(
        submit_fast, app, "POST", "/v1/tasks", json_headers, orjson.dumps(SPEC)
    )
    assert handled
    assert sent[0]["status"] == 201
    task = orjson.loads(sent[1]["body"])
    handled, sent = await asgi_call(
        get_fast, app, "GET", f"/v1/tasks/{task['id']}", keys.tenant_a,
        path_params={"taskId": task["id"]},
    )
    assert handled
    assert (sent[0]["status"], orjson.loads(sent[1]["body"])) == (200, task)


async def test_the_fast_paths_hand_on_everything_else(
    app: FastAPI, client, keys: Keys, db: AsyncEngine
):
    await warm(client, keys.tenant_a)
    await warm(client, keys.admin)
    both = await new_tenant_key(db, "tenant-a", "tenant-c")
    await warm(client, both)
    body = orjson.dumps(SPEC)
    plain = {**keys.tenant_a, "Content-Type": "application/json"}
    not_plain: list[tuple[dict[str, str], bytes]] = [
        ({"Content-Type": "application/json"}, body),  # no key
        ({"Authorization": "Bearer not-a-key", "Content-Type": "application/json"}, body),
        ({**keys.admin, "Content-Type": "application/json"}, body),  # not a tenant key
        ({**keys.tenant_a}, body),  # no content type
        ({**keys.tenant_a, "Content-Type": "text/plain"}, body),
        ({**both, "Content-Type": "application/json"}, body),  # which tenant?
        ({**plain, "X-Berth-Tenant": "tenant-b"}, body),  # not its tenant
        ({**plain, "X-Berth-Tenant": "t" * 129}, body),
        ({**plain, "Idempotency-Key": "k" * 256}, body),
        (plain, b""),
        (plain, b"{not json"),
        (plain, orjson.dumps({**SPEC, "unknown": 1})),
        (plain, b"[]"),
    ]
    for headers, content in not_plain:
        handled, sent = await asgi_call(submit_fast, app, "POST", "/v1/tasks", headers, content)
        assert (handled, sent) == (False, []), headers
    for task_id, headers in [
        ("not-a-uuid", keys.tenant_a),
        ("0" * 65, keys.tenant_a),
        ("7d1c6f3e-0c1a-4c1e-9a57-3a2b1c0d9e8f", keys.admin),
        ("7d1c6f3e-0c1a-4c1e-9a57-3a2b1c0d9e8f", {**keys.tenant_a, "X-Berth-Tenant": "tenant-b"}),
    ]:
        handled, sent = await asgi_call(
            get_fast, app, "GET", f"/v1/tasks/{task_id}", headers, path_params={"taskId": task_id}
        )
        assert (handled, sent) == (False, []), task_id
    listed = await client.get("/v1/tasks", headers=keys.tenant_a)
    assert listed.json()["items"] == [], "nothing handed on was stored"


async def test_handed_on_submissions_get_their_body_and_the_regular_answer(client, keys: Keys):
    await warm(client, keys.tenant_a)

    unknown = await client.post("/v1/tasks", json={**SPEC, "bogus": 1}, headers=keys.tenant_a)
    malformed = await client.post(
        "/v1/tasks", content=b"{not json",
        headers={**keys.tenant_a, "Content-Type": "application/json"},
    )

    async def chunks():
        yield b'{"runtimeClass": "gpu-small", '
        yield b'"requests": {"cpuMillis": -1}}'

    chunked = await client.post(
        "/v1/tasks", content=chunks(),
        headers={**keys.tenant_a, "Content-Type": "application/json"},
    )
    problem = assert_problem(unknown, 422)
    assert ["body", "bogus"] in [e["loc"] for e in problem["errors"]]
    assert malformed.status_code == 422
    assert malformed.headers["content-type"].startswith(PROBLEM_JSON)
    assert any(e["loc"][-1] == "cpuMillis" for e in assert_problem(chunked, 422)["errors"])


async def test_fast_path_errors_are_the_regular_problems(client, keys: Keys):
    await warm(client, keys.tenant_a)
    await warm(client, keys.tenant_b)
    task = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()

    nul = await client.post(
        "/v1/tasks", json={**SPEC, "labels": {"app": "a\x00b"}}, headers=keys.tenant_a
    )
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

    assert "NUL" in assert_problem(nul, 422)["detail"]
    assert reused.status_code == 201
    assert assert_problem(reused_other, 409)["type"].endswith("idempotency-key-reused")
    assert assert_problem(foreign, 404) == assert_problem(missing, 404)


async def test_metrics_label_fast_requests_by_their_route(client, keys: Keys):
    await warm(client, keys.tenant_a)
    task = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()
    assert (await client.get(f"/v1/tasks/{task['id']}", headers=keys.tenant_a)).status_code == 200

    metrics = (await client.get("/metrics")).text

    assert 'handler="/v1/tasks/{taskId}"' in metrics
    assert task["id"] not in metrics
