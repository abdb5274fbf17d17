"""Load shedding: the in-flight bound (503) and the per-key token bucket (429), in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from app.api.shedding import TokenBuckets
from tests.api.configured import serving
from tests.api.conftest import Keys, assert_problem

SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 500, "memoryMiB": 256}}
ANSWER_WITHIN_SECONDS = 10  # generous: a refusal is immediate, a hang never answers


class StalledBody:
    """A request body that sends its first bytes, then waits until released."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.reading.set()
        yield b'{"runtimeClass": "gpu-small", '
        await self.release.wait()
        yield b'"requests": {"cpuMillis": 500, "memoryMiB": 256}}'


def shed(reason: str) -> float:
    """Return how many requests this process has shed for ``reason``."""
    return REGISTRY.get_sample_value("berth_http_requests_shed_total", {"reason": reason}) or 0.0


async def test_past_the_in_flight_bound_requests_get_503_at_once_and_probes_still_answer(
    database_url: str, keys: Keys
) -> None:
    shed_before = shed("in_flight_limit")
    async with serving(database_url, max_in_flight_requests=2) as client:
        bodies = [StalledBody(), StalledBody()]
        held = [
            asyncio.create_task(
                client.post("/v1/tasks", content=body, headers={
                    **keys.tenant_a, "Content-Type": "application/json"})
            )
            for body in bodies
        ]
        for body in bodies:
            await asyncio.wait_for(body.reading.wait(), ANSWER_WITHIN_SECONDS)

        refused = await asyncio.wait_for(
            client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a), ANSWER_WITHIN_SECONDS
        )
        refused_read = await asyncio.wait_for(
            client.get("/v1/pools", headers=keys.admin), ANSWER_WITHIN_SECONDS
        )
        probes = [
            await asyncio.wait_for(client.get(path), ANSWER_WITHIN_SECONDS)
            for path in ("/healthz", "/readyz", "/metrics")
        ]

        for body in bodies:
            body.release.set()
        finished = await asyncio.wait_for(asyncio.gather(*held), ANSWER_WITHIN_SECONDS)
        after = await client.post("/v1/tasks", json=SPEC, headers=keys.tenant_a)

    problem = assert_problem(refused, 503)
    assert problem["type"].endswith("/overloaded")
    assert "BERTH_MAX_IN_FLIGHT_REQUESTS" in problem["detail"]
    assert refused.headers["retry-after"] == "1"
    assert_problem(refused_read, 503)
    assert [p.status_code for p in probes] == [200, 200, 200]
    assert [r.status_code for r in finished] == [201, 201], [r.text for r in finished]
    assert after.status_code == 201, after.text  # the slots were given back
    assert shed("in_flight_limit") == shed_before + 2


async def test_a_key_past_its_bucket_gets_429_with_retry_after_and_others_do_not(
    database_url: str, keys: Keys
) -> None:
    shed_before = shed("rate_limit")
    # Refill is negligible (one token per ~17 minutes): the burst is all a key gets here.
    async with serving(
        database_url, rate_limit_requests_per_second=0.001, rate_limit_burst_requests=3
    ) as client:
        allowed = [await client.get("/v1/pools", headers=keys.admin) for _ in range(3)]
        refused = await client.get("/v1/pools", headers=keys.admin)
        refused_write = await client.post("/v1/pools", json={}, headers=keys.admin)
        other_key = await client.get("/v1/pools", headers=keys.tenant_a)
        no_key = [await client.get("/v1/pools") for _ in range(5)]
        probes = [await client.get("/healthz", headers=keys.admin) for _ in range(5)]

    assert [r.status_code for r in allowed] == [200, 200, 200]
    problem = assert_problem(refused, 429)
    assert problem["type"].endswith("/rate-limited")
    assert "0.001 requests per second" in problem["detail"]
    retry_after = int(refused.headers["retry-after"])
    assert 900 <= retry_after <= 1000  # (1 token missing) / 0.001 per second, rounded up
    assert_problem(refused_write, 429)
    assert other_key.status_code == 200
    assert {r.status_code for r in no_key} == {401}  # no key: the front door's 401, no bucket
    assert {r.status_code for r in probes} == {200}
    assert shed("rate_limit") == shed_before + 2


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    buckets = TokenBuckets(rate_per_second=2.0, burst=3)

    spent = [buckets.take(b"k", now=100.0) for _ in range(3)]
    empty = buckets.take(b"k", now=100.0)
    half_refilled = buckets.take(b"k", now=100.25)
    refilled = buckets.take(b"k", now=100.5)
    # A long pause refills the bucket to its burst, never past it.
    after_pause = [buckets.take(b"k", now=1000.0) for _ in range(4)]

    assert spent == [0.0, 0.0, 0.0]
    assert empty == pytest.approx(0.5)  # one token at 2 per second
    assert half_refilled == pytest.approx(0.25)
    assert refilled == 0.0
    assert after_pause[:3] == [0.0, 0.0, 0.0] and after_pause[3] == pytest.approx(0.5)
    assert buckets.take(b"other", now=100.5) == 0.0  # every key has its own bucket


def test_token_buckets_keep_a_bounded_number_of_keys_dropping_the_least_recent() -> None:
    buckets = TokenBuckets(rate_per_second=1.0, burst=1, max_keys=100)
    buckets.take(b"busy", now=0.0)

    for i in range(10_000):
        buckets.take(f"key-{i}".encode(), now=0.0)
        if i % 50 == 0:
            buckets.take(b"busy", now=0.0)  # used often: stays, and stays empty

    assert len(buckets) == 100
    assert buckets.take(b"busy", now=0.0) > 0
    assert buckets.take(b"key-0", now=0.0) == 0.0  # forgotten, so full again
