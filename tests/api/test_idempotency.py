"""Idempotent submission: concurrent duplicates race through the unique index safely."""

from __future__ import annotations

import asyncio
import uuid

from app.db import Database

SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 250}, "labels": {"job": "etl"}}


async def count(db: Database, sql: str) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval(sql))


async def test_twenty_concurrent_identical_submissions_create_one_task(client, keys, db):
    key = f"submit-{uuid.uuid4()}"
    headers = {**keys.tenant_a, "Idempotency-Key": key}
    answers = await asyncio.gather(
        *(client.post("/v1/tasks", json=SPEC, headers=headers) for _ in range(20))
    )
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 19 + [201], [r.text for r in answers if r.status_code >= 300]
    assert len({r.json()["id"] for r in answers}) == 1
    assert len({r.headers["location"] for r in answers}) == 1
    assert await count(db, "SELECT count(*) FROM tasks") == 1
    assert await count(db, "SELECT count(*) FROM task_events") == 1


async def test_a_repeat_returns_the_original_task(client, keys):
    headers = {**keys.tenant_a, "Idempotency-Key": "k-1"}
    first = await client.post("/v1/tasks", json=SPEC, headers=headers)
    assert first.status_code == 201
    # The same spec, written differently (key order, explicit defaults), is the same request.
    same = {"labels": {"job": "etl"}, "requests": {"cpuMillis": 250, "llmSlots": 0},
            "runtimeClass": "gpu-small", "priority": 0}
    again = await client.post("/v1/tasks", json=same, headers=headers)
    assert again.status_code == 200
    assert again.json() == first.json()


async def test_same_key_with_a_different_body_is_409(client, keys, db):
    headers = {**keys.tenant_a, "Idempotency-Key": "k-2"}
    assert (await client.post("/v1/tasks", json=SPEC, headers=headers)).status_code == 201
    other = {**SPEC, "requests": {"cpuMillis": 500}}
    r = await client.post("/v1/tasks", json=other, headers=headers)
    assert r.status_code == 409
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "Idempotency-Key" in r.json()["detail"]
    assert await count(db, "SELECT count(*) FROM tasks") == 1


async def test_keys_are_per_tenant_and_submissions_without_a_key_are_distinct(client, keys, db):
    a = await client.post("/v1/tasks", json=SPEC, headers={**keys.tenant_a, "Idempotency-Key": "x"})
    b = await client.post("/v1/tasks", json=SPEC, headers={**keys.tenant_b, "Idempotency-Key": "x"})
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    plain = [await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a) for _ in range(2)]
    assert [r.status_code for r in plain] == [201, 201]
    assert await count(db, "SELECT count(*) FROM tasks") == 4


async def test_a_concurrent_race_with_different_bodies_lets_exactly_one_win(client, keys, db):
    headers = {**keys.tenant_a, "Idempotency-Key": "race"}
    bodies = [{**SPEC, "priority": i % 2} for i in range(10)]
    answers = await asyncio.gather(
        *(client.post("/v1/tasks", json=b, headers=headers) for b in bodies)
    )
    created = [r for r in answers if r.status_code == 201]
    assert len(created) == 1
    winner = created[0].json()["priority"]
    for body, r in zip(bodies, answers, strict=True):
        expected = (200, 201) if body["priority"] == winner else (409,)
        assert r.status_code in expected, (body, r.status_code, r.text)
    assert await count(db, "SELECT count(*) FROM tasks") == 1
