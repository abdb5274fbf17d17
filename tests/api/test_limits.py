"""The request body size limit: larger bodies are 413 problem+json, before any parsing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from tests.api.conftest import Keys, assert_problem, pool_body

LIMIT = 1024 * 1024  # the default max_body_bytes


def padded(body: dict, size: int) -> bytes:
    """Return ``body`` as JSON padded with trailing whitespace to exactly ``size`` bytes."""
    raw = json.dumps(body).encode()
    return raw + b" " * (size - len(raw))


async def chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """Yield ``data`` in pieces, so that httpx sends it chunked (no Content-Length)."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_body_over_the_limit_is_413(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post(
        "/v1/pools",
        content=padded(pool_body("pool-x"), LIMIT + 1),
        headers={**keys.admin, "Content-Type": "application/json"},
    )

    body = assert_problem(response, 413)
    assert str(LIMIT) in body["detail"]
    assert (await client.get("/v1/pools/pool-x", headers=keys.admin)).status_code == 404


async def test_body_at_the_limit_is_accepted(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post(
        "/v1/pools",
        content=padded(pool_body("pool-x"), LIMIT),
        headers={**keys.admin, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text


async def test_chunked_body_over_the_limit_is_413(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post(
        "/v1/pools",
        content=chunks(padded(pool_body("pool-x"), LIMIT + 10)),
        headers={**keys.admin, "Content-Type": "application/json"},
    )
    assert_problem(response, 413)


async def test_chunked_body_under_the_limit_is_read_whole(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        "/v1/pools",
        content=chunks(padded(pool_body("pool-x"), 200_000), size=1000),
        headers={**keys.admin, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["id"] == "pool-x"


async def test_oversized_body_without_a_key_is_401_and_left_unread(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/tasks",
        content=b"{" + b" " * LIMIT + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert_problem(response, 401)
    assert response.headers["connection"] == "close"
