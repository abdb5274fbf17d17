"""Task batches (POST /v1/task-batches): one result per item in request order, each item
answered as createTask would answer it alone, stored by one statement, committed before the
200."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import orjson
import pytest

from app.api import bodies
from app.api.bodies import (
    DEPTH_MAX,
    MalformedBody,
    _strict_decode,
    _structure_check,
    json_decode,
)
from app.db import Database
from app.ledger.keys import api_key_create
from tests.api.configured import serving
from tests.api.conftest import assert_problem

URL = "/v1/task-batches"
SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 250}, "labels": {"job": "etl"}}


def spec(cpu: int = 250, **extra: Any) -> dict[str, Any]:
    return {**SPEC, "requests": {"cpuMillis": cpu}, **extra}


async def count(db: Database, sql: str, *args: Any) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval(sql, *args))


async def batch(client: httpx.AsyncClient, headers: dict[str, str],
                *items: dict[str, Any]) -> list[dict[str, Any]]:
    r = await client.post(URL, json={"items": list(items)}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    results = r.json()["items"]
    assert [x["index"] for x in results] == list(range(len(items)))
    return results


async def test_valid_and_invalid_items_are_answered_one_by_one_in_request_order(
    client, keys, db
):
    results = await batch(
        client, keys.tenant_a,
        {"spec": spec(100)},
        {"spec": {**SPEC, "requests": {"cpuMillis": "500"}}},  # strict types: 422
        {"spec": spec(200)},
        {"spec": spec(300), "unknown": 1},  # an unknown field of the item
        "not an item",
        {"spec": spec(400)},
    )
    assert [x["status"] for x in results] == [201, 422, 201, 422, 422, 201]
    created = [x["task"] for x in results if x["status"] == 201]
    assert [t["spec"]["requests"]["cpuMillis"] for t in created] == [100, 200, 400]
    assert all(t["state"] == "ADMITTED" and t["tenantId"] == "tenant-a" for t in created)
    for x in results:
        assert (x["task"] is None) == (x["status"] != 201)
        assert (x["problem"] is None) == (x["status"] == 201)
    # Admission order follows request order.
    listed = (await client.get("/v1/tasks", headers=keys.tenant_a)).json()["items"]
    assert [t["id"] for t in listed] == [t["id"] for t in created]
    # Each task has its ADMITTED event; nothing else was stored.
    assert await count(db, "SELECT count(*) FROM tasks") == 3
    assert await count(db, "SELECT count(*) FROM task_events WHERE to_state = 'ADMITTED'") == 3
    # The created task reads back exactly as the batch answered it.
    one = (await client.get(f"/v1/tasks/{created[0]['id']}", headers=keys.tenant_a)).json()
    assert {k: v for k, v in one.items() if k != "queue"} == {
        k: v for k, v in created[0].items() if k != "queue"
    }


async def test_an_invalid_item_gets_the_problem_a_single_submission_gets(client, keys):
    bad = {**SPEC, "requests": {"cpuMillis": "500"}, "runtime_class": "x"}
    single = assert_problem(await client.post("/v1/tasks", json=bad, headers=keys.tenant_a), 422)
    [item] = await batch(client, keys.tenant_a, {"spec": bad})
    problem = item["problem"]
    assert problem["status"] == 422 and problem["type"] == single["type"]
    assert problem["title"] == single["title"]
    # The same errors, located inside the item instead of the body.
    assert [e["msg"] for e in problem["errors"]] == [e["msg"] for e in single["errors"]]
    assert [e["loc"] for e in problem["errors"]] == [
        ["spec", *e["loc"][1:]] for e in single["errors"]
    ]
    assert problem["detail"] == single["detail"].replace("body.", "spec.", 1)


async def test_a_nul_character_in_one_spec_is_that_item_s_422(client, keys, db):
    results = await batch(client, keys.tenant_a, {"spec": spec(labels={"a": "x\x00y"})},
                          {"spec": spec(labels={"a": "x\\u0000y"})})
    assert [x["status"] for x in results] == [422, 201]
    assert results[0]["problem"]["type"].endswith("/validation")
    assert await count(db, "SELECT count(*) FROM tasks") == 1


async def test_an_item_key_replays_like_the_idempotency_key_header(client, keys, db):
    single = await client.post("/v1/tasks", json=SPEC,
                               headers={**keys.tenant_a, "Idempotency-Key": "k-single"})
    assert single.status_code == 201
    first = await batch(client, keys.tenant_a,
                        {"spec": SPEC, "idempotencyKey": "k-single"},
                        {"spec": spec(500), "idempotencyKey": "k-single"},
                        {"spec": SPEC, "idempotencyKey": "k-batch"},
                        {"spec": SPEC})
    assert [x["status"] for x in first] == [200, 409, 201, 201]
    assert first[0]["task"] == single.json()
    assert first[1]["problem"]["type"].endswith("/idempotency-key-reused")
    assert first[1]["task"] is None
    # A repeat of the batch replays its keyed items; the unkeyed one is a new task.
    again = await batch(client, keys.tenant_a,
                        {"spec": SPEC, "idempotencyKey": "k-single"},
                        {"spec": spec(500), "idempotencyKey": "k-single"},
                        {"spec": SPEC, "idempotencyKey": "k-batch"},
                        {"spec": SPEC})
    assert [x["status"] for x in again] == [200, 409, 200, 201]
    assert again[2]["task"]["id"] == first[2]["task"]["id"]
    # A key first used in a batch replays through the header too.
    header = await client.post("/v1/tasks", json=SPEC,
                               headers={**keys.tenant_a, "Idempotency-Key": "k-batch"})
    assert header.status_code == 200 and header.json()["id"] == first[2]["task"]["id"]
    assert await count(db, "SELECT count(*) FROM tasks") == 4


async def test_a_key_repeated_inside_a_batch_replays_its_first_occurrence(client, keys, db):
    results = await batch(client, keys.tenant_a,
                          {"spec": {**SPEC, "requests": {}}, "idempotencyKey": "dup"},  # 422
                          {"spec": SPEC, "idempotencyKey": "dup"},
                          {"spec": SPEC, "idempotencyKey": "dup"},
                          {"spec": spec(999), "idempotencyKey": "dup"})
    assert [x["status"] for x in results] == [422, 201, 200, 409]
    assert results[2]["task"]["id"] == results[1]["task"]["id"]
    assert await count(db, "SELECT count(*) FROM tasks") == 1


async def test_keys_are_per_tenant(client, keys, db):
    [a] = await batch(client, keys.tenant_a, {"spec": SPEC, "idempotencyKey": "shared"})
    [b] = await batch(client, keys.tenant_b, {"spec": SPEC, "idempotencyKey": "shared"})
    assert a["status"] == b["status"] == 201
    assert a["task"]["id"] != b["task"]["id"]
    assert b["task"]["tenantId"] == "tenant-b"
    listed = (await client.get("/v1/tasks", headers=keys.tenant_b)).json()["items"]
    assert [t["id"] for t in listed] == [b["task"]["id"]]


@pytest.mark.parametrize("role", ["admin", "operator_x", "runtime_1"])
async def test_only_tenant_keys_submit_batches(client, keys, db, role):
    r = await client.post(URL, json={"items": [{"spec": SPEC}]}, headers=keys[role])
    assert_problem(r, 403)
    assert await count(db, "SELECT count(*) FROM tasks") == 0


async def test_without_a_key_it_is_401(client):
    assert_problem(await client.post(URL, json={"items": [{"spec": SPEC}]}), 401)


async def test_a_key_acting_for_several_tenants_names_one(client, db):
    async with db.transaction() as conn:
        both = await api_key_create(conn, role="tenant", subject="both",
                                    tenant_ids=["tenant-a", "tenant-b"])
    headers = {"Authorization": f"Bearer {both}"}
    assert_problem(await client.post(URL, json={"items": [{"spec": SPEC}]}, headers=headers),
                   400)
    [x] = await batch(client, {**headers, "X-Berth-Tenant": "tenant-b"}, {"spec": SPEC})
    assert x["task"]["tenantId"] == "tenant-b"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"items": []}, ["body", "items"]),
        ({"items": [{"spec": SPEC}] * 1001}, ["body", "items"]),
        ({}, ["body", "items"]),
        ({"items": {"spec": SPEC}}, ["body", "items"]),
        ({"items": [{"spec": SPEC}], "extra": 1}, ["body", "extra"]),
        ([{"spec": SPEC}], ["body"]),
    ],
    ids=["empty", "1001-items", "no-items", "items-not-a-list", "unknown-field", "not-an-object"],
)
async def test_a_body_that_is_not_a_batch_is_422_as_a_whole(client, keys, db, body, where):
    problem = assert_problem(await client.post(URL, json=body, headers=keys.tenant_a), 422)
    assert problem["errors"][0]["loc"] == where
    assert await count(db, "SELECT count(*) FROM tasks") == 0


async def test_a_thousand_items_are_accepted(client, keys, db):
    results = await batch(client, keys.tenant_a, *({"spec": spec(i + 1)} for i in range(1000)))
    assert {x["status"] for x in results} == {201}
    assert [x["task"]["spec"]["requests"]["cpuMillis"] for x in results] == list(
        range(1, 1001)
    )
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT (spec->'requests'->>'cpuMillis')::int FROM tasks "
                                "ORDER BY seq")
    assert [r[0] for r in rows] == list(range(1, 1001))


@pytest.mark.parametrize(
    ("raw", "content_type", "status"),
    [
        (b'{"items": [', "application/json", 400),
        (b'{"items": [], "items": []}', "application/json", 400),  # a repeated key
        (b'{"items": [{"spec": NaN}]}', "application/json", 400),
        (orjson.dumps({"items": [{"spec": SPEC}]}), "text/plain", 415),
        (b"", "application/json", 422),
    ],
    ids=["truncated", "repeated-key", "nan", "media-type", "no-body"],
)
async def test_bodies_are_read_strictly(client, keys, db, raw, content_type, status):
    r = await client.post(URL, content=raw,
                          headers={**keys.tenant_a, "Content-Type": content_type})
    assert_problem(r, status)
    assert await count(db, "SELECT count(*) FROM tasks") == 0


async def test_an_unknown_query_parameter_is_422(client, keys):
    r = await client.post(URL + "?dryRun=1", json={"items": [{"spec": SPEC}]},
                          headers=keys.tenant_a)
    assert_problem(r, 422)


async def test_the_batch_body_limit_is_its_own(database_url, db):
    async with db.transaction() as conn:
        key = await api_key_create(conn, role="tenant", subject="t", tenant_ids=["acme"])
    headers = {"Authorization": f"Bearer {key}"}
    body = {"items": [{"spec": spec(labels={"pad": "x" * 60})} for _ in range(1000)]}
    size = len(orjson.dumps(body))
    async with serving(database_url, max_body_bytes=size // 2,
                       max_batch_body_bytes=size + 1) as client:
        r = await client.post(URL, json=body, headers=headers)
        assert r.status_code == 200, r.text
        # The other routes keep theirs.
        big = spec(labels={f"k{i}": "x" * 60 for i in range(64)})
        r = await client.post("/v1/tasks", content=orjson.dumps(big) + b" " * size,
                              headers={**headers, "Content-Type": "application/json"})
        assert_problem(r, 413)
    async with serving(database_url, max_batch_body_bytes=size - 1) as client:
        assert_problem(await client.post(URL, json=body, headers=headers), 413)


async def test_past_the_tenant_cap_the_rest_of_a_batch_is_429(database_url, db):
    async with db.transaction() as conn:
        key = await api_key_create(conn, role="tenant", subject="t", tenant_ids=["acme"])
    headers = {"Authorization": f"Bearer {key}"}
    async with serving(database_url, max_queued_tasks_per_tenant=3) as client:
        r = await client.post("/v1/tasks", json=SPEC,
                              headers={**headers, "Idempotency-Key": "old"})
        assert r.status_code == 201
        results = await batch(client, headers,
                              {"spec": SPEC},
                              {"spec": SPEC, "idempotencyKey": "old"},  # a replay takes no room
                              {"spec": {**SPEC, "requests": {}}},  # invalid takes none either
                              {"spec": SPEC, "idempotencyKey": "new"},
                              {"spec": SPEC},
                              {"spec": SPEC, "idempotencyKey": "new"})
        assert [x["status"] for x in results] == [201, 200, 422, 201, 429, 200]
        problem = results[4]["problem"]
        assert problem["type"].endswith("/tenant-queue-full") and problem["status"] == 429
        assert problem["maxQueuedTasks"] == 3 and problem["retryAfter"] > 0
        assert "BERTH_MAX_QUEUED_TASKS_PER_TENANT" in problem["detail"]
        # Full now: every new item is refused, a repeat of a stored one still replays, and a
        # key first refused stays refused for its repeats.
        results = await batch(client, headers, {"spec": SPEC, "idempotencyKey": "new"},
                              {"spec": SPEC, "idempotencyKey": "later"},
                              {"spec": SPEC, "idempotencyKey": "later"})
        assert [x["status"] for x in results] == [200, 429, 429]
    assert await count(db, "SELECT count(*) FROM tasks") == 3
    assert await count(db, "SELECT sum(queued) FROM tenant_queue_counts") == 3


async def test_past_the_tenant_cap_a_batch_without_keys_stores_its_first_items(
    database_url, db
):
    async with db.transaction() as conn:
        key = await api_key_create(conn, role="tenant", subject="t", tenant_ids=["acme"])
    headers = {"Authorization": f"Bearer {key}"}
    async with serving(database_url, max_queued_tasks_per_tenant=3) as client:
        assert (await client.post("/v1/tasks", json=SPEC, headers=headers)).status_code == 201
        results = await batch(client, headers, {"spec": spec(1)},
                              {"spec": {**SPEC, "requests": {}}},  # invalid: takes no room
                              {"spec": spec(2)}, {"spec": spec(3)}, {"spec": spec(4)})
        assert [x["status"] for x in results] == [201, 422, 201, 429, 429]
        assert all(x["problem"]["type"].endswith("/tenant-queue-full") for x in results[3:])
        listed = (await client.get("/v1/tasks", headers=headers)).json()["items"]
        assert [t["spec"]["requests"]["cpuMillis"] for t in listed] == [250, 1, 2]
        assert [t["id"] for t in listed[1:]] == [results[0]["task"]["id"],
                                                 results[2]["task"]["id"]]
    assert await count(db, "SELECT count(*) FROM tasks") == 3
    assert await count(db, "SELECT count(*) FROM task_events") == 3
    assert await count(db, "SELECT sum(queued) FROM tenant_queue_counts") == 3


async def test_task_ids_are_uuid7_in_admission_order(client, keys):
    single = (await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)).json()
    results = await batch(client, keys.tenant_a, *({"spec": spec(i + 1)} for i in range(20)))
    results += await batch(client, keys.tenant_a, {"spec": spec(1), "idempotencyKey": "k"},
                           {"spec": spec(2)})
    ids = [single["id"], *(x["task"]["id"] for x in results)]
    assert all(uuid.UUID(i).version == 7 for i in ids)
    assert len(set(ids)) == len(ids)
    # Within a batch the ids follow the items (the batch's millisecond, then the position).
    assert ids[1:21] == sorted(ids[1:21]) and ids[21:] == sorted(ids[21:])
    listed = (await client.get("/v1/tasks", headers=keys.tenant_a)).json()["items"]
    assert [t["id"] for t in listed] == ids


async def test_concurrent_batches_with_the_same_keys_create_each_task_once(client, keys, db):
    items = [{"spec": spec(i + 1), "idempotencyKey": f"k{i}"} for i in range(50)]
    answers = await asyncio.gather(*(batch(client, keys.tenant_a, *items) for _ in range(5)))
    for i in range(50):
        statuses = sorted(answer[i]["status"] for answer in answers)
        assert statuses == [200] * 4 + [201]
        assert len({answer[i]["task"]["id"] for answer in answers}) == 1
    assert await count(db, "SELECT count(*) FROM tasks") == 50
    assert await count(db, "SELECT count(*) FROM task_events") == 50


async def test_one_statement_stores_the_batch_and_wakes_the_reconcilers(client, keys, db):
    conn = await db.connect()
    woken: list[str] = []
    try:
        await conn.add_listener("berth_wakeup", lambda *args: woken.append(args[-1]))
        await batch(client, keys.tenant_a, *({"spec": SPEC} for _ in range(10)))
        for _ in range(50):
            if woken:
                break
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    assert woken == ["submitted"]


COMPLEX = {
    "runtimeClass": "gpu-small", "requests": {"cpuMillis": 250, "memoryMiB": 1, "llmSlots": 2},
    "constraints": {"regions": ["eu-west-1"], "poolSelector": {"tier": "std"},
                    "artifactRegion": "eu-west-1", "dataResidency": "eu"},
    "affinity": {"preferred": [{"selector": {"app": "web"}, "topology": "pool", "weight": 10}],
                 "required": [{"selector": {"app": "db"}, "topology": "region", "anti": True}]},
    "gang": {"members": 4, "minPools": 2}, "priority": 5, "labels": {"app": "web"},
    "maxAttempts": 2, "preemption": "lowerPriority",
}


async def test_a_spec_with_every_field_replays_across_single_and_batch(client, keys):
    single = await client.post("/v1/tasks", json=COMPLEX,
                               headers={**keys.tenant_a, "Idempotency-Key": "full"})
    assert single.status_code == 201, single.text
    [x] = await batch(client, keys.tenant_a, {"spec": COMPLEX, "idempotencyKey": "full"})
    assert x["status"] == 200 and x["task"] == single.json()
    [y] = await batch(client, keys.tenant_a, {"spec": COMPLEX, "idempotencyKey": "full-2"})
    again = await client.post("/v1/tasks", json=COMPLEX,
                              headers={**keys.tenant_a, "Idempotency-Key": "full-2"})
    assert again.status_code == 200 and again.json()["id"] == y["task"]["id"]
    assert y["task"]["spec"] == single.json()["spec"]


DOCUMENTS = [
    b'{"a":1}', b'  {"a" : 1 ,\n"b":[1,2, {"c" :"d"}]}  ', b'{"a":1,"a":2}',
    b'{"a":{"b":1,"b" :2}}', b'{"a":[{"b":1},{"b":2,"b":3}]}', b'{"a":NaN}', b'{"a":1e400}',
    b'{"a":123456789012345678901234567890}', b'{"a":-9223372036854775809}', b'{"a":-0}',
    b'{"a":1} x', b'\xef\xbb\xbf{"a":1}', b"\xff", b'{"a":"x\\"y"}', b'{"a":"\\u0000"}',
    b'{"a":"b\\":\\"c","a":1}', b'{"a:":1,"b":"\\": "}', b'{"a":"\\ud800"}', b'"x"', b"[]",
    b"[" * 64 + b"]" * 64, b"[" * 65 + b"]" * 65, b'{"a":' * 64 + b"1" + b"}" * 64,
    b'{"a":' * 65 + b"1" + b"}" * 65, b"[" * 64 + b"{}" + b"]" * 64,
    b"[" * 63 + b'{"a":[]}' + b"]" * 63, b"[" * 63 + b'{"a":{}}' + b"]" * 63,
]


@pytest.mark.parametrize("raw", DOCUMENTS, ids=lambda raw: raw[:24].decode("latin-1"))
def test_the_orjson_first_decoder_answers_as_the_strict_one(raw: bytes) -> None:
    def answer(decode: Any) -> Any:
        try:
            value = decode(raw)
        except MalformedBody as e:
            return ("400", e.detail)
        return ("ok", repr(value))  # repr tells an int from a float, and inf apart

    def strict(raw: bytes) -> Any:
        # The strict reader is always preceded by the structure check, which measures depth.
        _structure_check(raw)
        return _strict_decode(raw)

    assert answer(json_decode) == answer(strict)


def test_a_large_shallow_document_is_read_by_orjson_alone(monkeypatch: Any) -> None:
    raw = orjson.dumps({"items": [{"spec": COMPLEX, "idempotencyKey": f"k-{i}"}
                                  for i in range(1000)]})
    assert raw.count(b"[") + raw.count(b"{") > DEPTH_MAX
    expected = _strict_decode(raw)

    def refused(_raw: bytes) -> Any:
        raise AssertionError("a plain batch document went to the strict reader")

    monkeypatch.setattr(bodies, "_strict_decode", refused)
    assert json_decode(raw) == expected
