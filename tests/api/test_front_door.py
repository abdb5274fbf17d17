"""The front door: headers checked and the key verified before any body is read.

Each test pins one way a client without a valid key (or with a hostile header) used to make
the API do work or answer wrongly: slots held by slow bodies, 500s for deep JSON, one key
counted as many, a query per random invalid key, repeated and non-ASCII headers.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from prometheus_client import REGISTRY

from app.api import bodies, front_door
from app.api.bodies import DEPTH_MAX, OFF_LOOP_BYTES, VALUES_MAX
from app.main import create_app
from tests.api.conftest import (
    BASE_URL,
    TENANT_A,
    Keys,
    assert_problem,
    settings_for_tests,
)
from tests.api.test_shedding import StalledBody

SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 500, "memoryMiB": 256}}
WITHIN_SECONDS = 10  # generous: every refusal here is immediate, a held slot never answers


def shed(reason: str) -> float:
    return REGISTRY.get_sample_value("berth_http_requests_shed_total", {"reason": reason}) or 0.0


def unauthenticated(reason: str) -> float:
    return REGISTRY.get_sample_value(
        "berth_http_requests_unauthenticated_total", {"reason": reason}) or 0.0


class Lookups:
    """Counts the database look-ups of keys, around the real one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.gate: asyncio.Event | None = None
        self.entered: asyncio.Queue[None] = asyncio.Queue()
        real = front_door.principal_verify

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            self.entered.put_nowait(None)
            if self.gate is not None:
                await self.gate.wait()
            return await real(*args, **kwargs)

        monkeypatch.setattr(front_door, "principal_verify", counted)


def random_key() -> dict[str, str]:
    return {"Authorization": f"Bearer berth_{secrets.token_urlsafe(32)}"}


async def app_client(database_url: str, **settings: Any) -> tuple[FastAPI, httpx.AsyncClient]:
    app = create_app(settings_for_tests(database_url, **settings))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return app, httpx.AsyncClient(transport=transport, base_url=BASE_URL)


# --- 1. slow bodies without a key take no slot --------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer berth_not_a_key_at_all"])
async def test_slow_bodies_without_a_valid_key_are_401_unread_and_take_no_slot(
    database_url: str, keys: Keys, authorization: str | None
) -> None:
    app, client = await app_client(database_url, max_in_flight_requests=2)
    headers = {"Content-Type": "application/json", "Content-Length": "100"}
    if authorization:
        headers["Authorization"] = authorization
    async with app.router.lifespan_context(app), client:
        stalled = [StalledBody() for _ in range(10)]
        refused = await asyncio.wait_for(asyncio.gather(*(
            client.post("/v1/task-batches", content=body, headers=headers) for body in stalled
        )), WITHIN_SECONDS)
        reads = [await client.get("/v1/tasks", headers=keys.tenant_a) for _ in range(5)]
        for body in stalled:
            body.release.set()

    for answer in refused:
        assert_problem(answer, 401)
        assert answer.headers["connection"] == "close"  # the announced body is left unread
        assert answer.headers["www-authenticate"] == "Bearer"
    assert [r.status_code for r in reads] == [200] * 5


async def test_the_in_flight_bound_counts_only_authenticated_work(
    database_url: str, keys: Keys
) -> None:
    app, client = await app_client(database_url, max_in_flight_requests=1)
    async with app.router.lifespan_context(app), client:
        body = StalledBody()
        held = asyncio.create_task(client.post(
            "/v1/tasks", content=body, headers={**keys.tenant_a,
                                                 "Content-Type": "application/json"}))
        await asyncio.wait_for(body.reading.wait(), WITHIN_SECONDS)
        # The one slot is the authenticated slow body's: another authenticated request is
        # shed, and a request without a key is still answered (401) at once.
        refused = await asyncio.wait_for(client.get("/v1/tasks", headers=keys.tenant_a),
                                         WITHIN_SECONDS)
        no_key = await asyncio.wait_for(client.get("/v1/tasks"), WITHIN_SECONDS)
        body.release.set()
        await asyncio.wait_for(held, WITHIN_SECONDS)

    assert_problem(refused, 503)
    assert assert_problem(no_key, 401)["type"].endswith("/unauthorized")


# --- 2. deep JSON is 400, on every body route ---------------------------------------------


def body_operations(app: FastAPI) -> list[tuple[str, str, str]]:
    """Return (method, path with ids filled in, media type) of every operation with a body."""
    found = []
    for path, item in app.openapi()["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            if content:
                filled = path.replace("{poolId}", "pool-x").replace(
                    "{taskId}", "00000000-0000-4000-8000-000000000000").replace(
                    "{leaseId}", "00000000-0000-4000-8000-000000000000").replace(
                    "{instanceId}", "rt-1").replace("{keyId}",
                                                    "00000000-0000-4000-8000-000000000000")
                found.append((method.upper(), filled, next(iter(content))))
    return found


@pytest.mark.parametrize("depth", [65, 255, 256, 300, 1024, 1025, 5000])
async def test_deep_json_is_400_on_every_body_route_and_401_without_a_key(
    app: FastAPI, client: httpx.AsyncClient, keys: Keys, depth: int
) -> None:
    operations = body_operations(app)
    assert len(operations) >= 9
    for deep in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        for method, path, media_type in operations:
            key = keys.runtime_1 if path.startswith(("/v1/runtimes", "/v1/leases")) else (
                keys.tenant_a if path.startswith(("/v1/task", "/v1/placements")) else keys.admin)
            answer = await client.request(
                method, path, content=deep, headers={**key, "Content-Type": media_type})
            problem = assert_problem(answer, 400)
            assert problem["type"].endswith("/malformed-body"), (method, path)
            assert f"deeper than {DEPTH_MAX} levels" in problem["detail"]
            without_key = await client.request(
                method, path, content=deep, headers={"Content-Type": media_type})
            assert_problem(without_key, 401)


# --- 3. large bodies: bounded, and parsed off the event loop ------------------------------


async def test_a_million_tiny_objects_are_refused_as_too_many_values(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    raw = b'{"items":[' + b",".join([b"{}"] * 1_000_000) + b',{"a":1234567890123456789}]}'
    assert len(raw) < 8 * 1024 * 1024
    answer = await client.post("/v1/task-batches", content=raw,
                               headers={**keys.tenant_a, "Content-Type": "application/json"})
    assert f"more than {VALUES_MAX} values" in assert_problem(answer, 400)["detail"]


async def test_a_large_body_is_decoded_in_a_worker_thread_a_small_one_inline(
    client: httpx.AsyncClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    real = bodies.json_decode

    def recorded(raw: bytes) -> Any:
        threads.append(threading.get_ident())
        return real(raw)

    monkeypatch.setattr(bodies, "json_decode", recorded)
    loop_thread = threading.get_ident()
    items = [{"spec": SPEC, "idempotencyKey": f"k-{i}"} for i in range(1000)]
    large = orjson.dumps({"items": items})
    assert len(large) > OFF_LOOP_BYTES
    tenant_json = {**keys.tenant_a, "Content-Type": "application/json"}
    batch = await client.post("/v1/task-batches", content=large, headers=tenant_json)
    single = await client.post("/v1/tasks", content=orjson.dumps(SPEC), headers=tenant_json)

    assert batch.status_code == 200, batch.text
    assert single.status_code == 201, single.text
    assert threads[0] != loop_thread  # the batch, in a worker
    assert threads[1] == loop_thread  # the small spec, inline


# --- 4. rate limits by verified key; invalid keys are budgeted ----------------------------


async def test_spaces_after_bearer_do_not_make_another_key(
    database_url: str, keys: Keys
) -> None:
    app, client = await app_client(database_url, rate_limit_requests_per_second=0.001,
                                   rate_limit_burst_requests=5)
    async with app.router.lifespan_context(app), client:
        answers = [
            await client.get("/v1/tasks", headers={
                "Authorization": "Bearer" + " " * spaces + keys.raw["tenant_a"]})
            for spaces in range(1, 301)
        ]
    statuses = [a.status_code for a in answers]
    assert statuses.count(200) == 5 and statuses.count(429) == 295


async def test_random_invalid_keys_cost_a_lookup_only_within_the_address_budget(
    database_url: str, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = Lookups(monkeypatch)
    limited_before = shed("invalid_key_limit")
    app, client = await app_client(database_url, invalid_keys_per_second=0.001,
                                   invalid_key_burst_requests=20)
    async with app.router.lifespan_context(app), client:
        first = await client.get("/v1/tasks", headers=keys.tenant_a)  # now a known key
        answers = [await client.get("/v1/tasks", headers=random_key()) for _ in range(200)]
        lookups_after_flood = lookups.count - 1
        # The client whose key this process knows is unaffected, even on a cache miss.
        app.state.key_cache.get = lambda digest, now: None  # every request misses the cache
        valid = [await client.get("/v1/tasks", headers=keys.tenant_a) for _ in range(3)]
        metrics = (await client.get("/metrics")).text

    statuses = [a.status_code for a in answers]
    assert statuses[:20] == [401] * 20
    assert statuses[20:] == [429] * 180
    limited = assert_problem(answers[-1], 429)
    assert limited["type"].endswith("/rate-limited")
    assert int(answers[-1].headers["retry-after"]) >= 1
    assert lookups_after_flood == 20  # no query past the budget
    assert shed("invalid_key_limit") == limited_before + 180
    assert [r.status_code for r in (first, *valid)] == [200] * 4
    # The metrics of the refusals name a reason, never a key or an address.
    series = [line for line in metrics.splitlines() if line.startswith((
        "berth_http_requests_unauthenticated_total{", "berth_http_requests_shed_total{"))]
    assert len(series) >= 10
    for line in series:
        labels = line[line.index("{") + 1:line.index("}")]
        assert labels.count("=") == 1 and labels.startswith("reason="), line
    assert "127.0.0.1" not in metrics
    flood_keys = [a.request.headers["authorization"][len("Bearer berth_"):] for a in answers]
    assert not any(key in metrics for key in flood_keys)


async def test_a_repeated_invalid_key_is_looked_up_once(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = Lookups(monkeypatch)
    refused_before = unauthenticated("refused_key")
    same = random_key()
    answers = [await client.get("/v1/tasks", headers=same) for _ in range(30)]
    assert {a.status_code for a in answers} == {401}
    assert lookups.count == 1
    assert unauthenticated("refused_key") == refused_before + 29


async def test_concurrent_first_requests_of_one_key_share_one_lookup(
    client: httpx.AsyncClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = Lookups(monkeypatch)
    answers = await asyncio.gather(
        *(client.get("/v1/tasks", headers=keys.tenant_a) for _ in range(50)))
    assert {a.status_code for a in answers} == {200}
    assert lookups.count == 1


async def test_past_the_unauthenticated_bound_key_checks_are_503_at_once(
    database_url: str, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = Lookups(monkeypatch)
    lookups.gate = asyncio.Event()
    shed_before = shed("unauthenticated_limit")
    app, client = await app_client(database_url, max_unauthenticated_requests=2)
    async with app.router.lifespan_context(app), client:
        held = [asyncio.create_task(client.get("/v1/tasks", headers=random_key()))
                for _ in range(2)]
        for _ in held:
            await asyncio.wait_for(lookups.entered.get(), WITHIN_SECONDS)
        refused = await asyncio.wait_for(client.get("/v1/tasks", headers=keys.tenant_a),
                                         WITHIN_SECONDS)
        lookups.gate.set()
        finished = await asyncio.wait_for(asyncio.gather(*held), WITHIN_SECONDS)
        after = await client.get("/v1/tasks", headers=keys.tenant_a)

    problem = assert_problem(refused, 503)
    assert "BERTH_MAX_UNAUTHENTICATED_REQUESTS" in problem["detail"]
    assert refused.headers["retry-after"] == "1"
    assert [f.status_code for f in finished] == [401, 401]
    assert after.status_code == 200
    assert shed("unauthenticated_limit") == shed_before + 1


# --- 9. repeated and non-ASCII headers ----------------------------------------------------


@pytest.mark.parametrize("name, first, second", [
    ("Authorization", "tenant_a", "tenant_b"),
    ("X-Berth-Tenant", TENANT_A, "tenant-b"),
    ("Idempotency-Key", "one", "two"),
    ("Content-Type", "application/json", "text/plain"),
])
async def test_a_repeated_singleton_header_is_400_and_nothing_is_stored(
    client: httpx.AsyncClient, keys: Keys, name: str, first: str, second: str
) -> None:
    values = [first, second]
    if name == "Authorization":
        values = [f"Bearer {keys.raw[v]}" for v in values]
    headers = [(name, v) for v in values]
    if name != "Authorization":
        headers.append(("Authorization", f"Bearer {keys.raw['tenant_a']}"))
    if name != "Content-Type":
        headers.append(("Content-Type", "application/json"))
    answer = await client.post("/v1/tasks", content=orjson.dumps(SPEC), headers=headers)
    problem = assert_problem(answer, 400)
    assert problem["type"].endswith("/malformed-header")
    assert name.lower() in problem["detail"] and "more than once" in problem["detail"]
    listed = await client.get("/v1/tasks", headers=keys.tenant_a)
    assert listed.json()["items"] == []


@pytest.mark.parametrize("name, value", [
    (b"Idempotency-Key", b"caf\xc3\xa9"),
    (b"Idempotency-Key", b"\xff\xfe"),
    (b"X-Berth-Tenant", b"tenant-\xe9"),
    (b"Content-Type", b"application/json\x01"),
])
async def test_a_text_header_that_is_not_printable_ascii_is_400_and_nothing_is_stored(
    client: httpx.AsyncClient, keys: Keys, name: bytes, value: bytes
) -> None:
    headers = [(b"Authorization", f"Bearer {keys.raw['tenant_a']}".encode()), (name, value)]
    if name != b"Content-Type":
        headers.append((b"Content-Type", b"application/json"))
    answer = await client.post("/v1/tasks", content=orjson.dumps(SPEC), headers=headers)
    problem = assert_problem(answer, 400)
    assert "not printable ASCII" in problem["detail"]
    listed = await client.get("/v1/tasks", headers=keys.tenant_a)
    assert listed.json()["items"] == []


async def test_headers_berth_does_not_read_may_repeat(
    client: httpx.AsyncClient, keys: Keys, pool_make: Any
) -> None:
    answer = await client.get("/v1/pools", headers=[
        ("Authorization", f"Bearer {keys.raw['admin']}"), ("Accept", "application/json"),
        ("Accept", "*/*"), ("X-Forwarded-For", "10.0.0.1"), ("X-Forwarded-For", "10.0.0.2")])
    assert answer.status_code == 200, answer.text
