"""Bearer keys and roles through the HTTP API: who is refused where, and how."""

from __future__ import annotations

import uuid

import httpx
import pytest

from app import auth
from app.db import Database
from app.ledger.keys import api_key_create
from tests.api.conftest import RUNTIME_1, Keys, PoolMaker, assert_problem, pool_body

CAPACITY = {"cpuMillis": 1, "memoryMiB": 1, "llmSlots": 1}
COMPLETION = {"outcome": "succeeded", "epoch": 1}

#: (method, path, json body) of every pool, runtime and lease route.
ROUTES = [
    ("POST", "/v1/pools", pool_body("pool-new")),
    ("GET", "/v1/pools", None),
    ("GET", "/v1/pools/pool-x", None),
    ("PATCH", "/v1/pools/pool-x", {"ready": False}),
    ("DELETE", "/v1/pools/pool-x", None),
    ("PUT", "/v1/pools/pool-x/capacity", CAPACITY),
    ("POST", "/v1/pools/pool-x/cordon", None),
    ("POST", "/v1/pools/pool-x/drain", None),
    ("POST", "/v1/pools/pool-x/activate", None),
    ("POST", f"/v1/runtimes/{RUNTIME_1}/heartbeat", None),
    ("GET", f"/v1/runtimes/{RUNTIME_1}/leases", None),
    ("POST", f"/v1/leases/{uuid.UUID(int=1)}/complete", COMPLETION),
]
ROUTE_IDS = [f"{method} {path}" for method, path, _ in ROUTES]

#: Who may call what on pool-x (tenant-a's pool, operated by operator-x, run by rt-1):
#: the expected status per role, in the order admin, tenant_a, tenant_b, operator_x,
#: operator_y, runtime_1. 404 where the pool is invisible to the caller.
EXPECTED = {
    "POST /v1/pools": (201, 403, 403, 403, 403, 403),
    "GET /v1/pools": (200, 200, 200, 200, 200, 200),
    "GET /v1/pools/pool-x": (200, 200, 404, 200, 404, 200),
    "PATCH /v1/pools/pool-x": (200, 403, 403, 403, 403, 403),
    "DELETE /v1/pools/pool-x": (204, 403, 403, 403, 403, 403),
    "PUT /v1/pools/pool-x/capacity": (200, 403, 403, 403, 403, 403),
    "POST /v1/pools/pool-x/cordon": (200, 403, 404, 200, 404, 403),
    "POST /v1/pools/pool-x/drain": (200, 403, 404, 200, 404, 403),
    "POST /v1/pools/pool-x/activate": (200, 403, 404, 200, 404, 403),
    f"POST /v1/runtimes/{RUNTIME_1}/heartbeat": (403, 403, 403, 403, 403, 200),
    f"GET /v1/runtimes/{RUNTIME_1}/leases": (403, 403, 403, 403, 403, 200),
    f"POST /v1/leases/{uuid.UUID(int=1)}/complete": (403, 403, 403, 403, 403, 404),
}
ROLES = ("admin", "tenant_a", "tenant_b", "operator_x", "operator_y", "runtime_1")


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=ROUTE_IDS)
async def test_each_role_gets_exactly_its_rights(
    client: httpx.AsyncClient,
    keys: Keys,
    pool_make: PoolMaker,
    method: str,
    path: str,
    body: dict | None,
) -> None:
    expected = EXPECTED[f"{method} {path}"]
    got = []
    for role in ROLES:
        # A fresh pool-x for every caller, so that a delete or cordon does not leak across.
        await client.delete("/v1/pools/pool-x", headers=keys.admin)
        await client.delete("/v1/pools/pool-new", headers=keys.admin)
        await pool_make("pool-x", operators=["operator-x"], runtimeInstanceId=RUNTIME_1)
        response = await client.request(method, path, json=body, headers=keys[role])
        if response.status_code >= 400:
            assert_problem(response, response.status_code)
        got.append(response.status_code)
    assert tuple(got) == expected, dict(zip(ROLES, got, strict=True))


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=ROUTE_IDS)
async def test_every_route_needs_a_valid_key(
    client: httpx.AsyncClient, keys: Keys, method: str, path: str, body: dict | None
) -> None:
    headers_tried = [
        {},
        {"Authorization": "Bearer berth_not-a-real-key"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {keys.raw['admin']}"},
        {"Authorization": keys.raw["admin"]},
    ]
    for headers in headers_tried:
        response = await client.request(method, path, json=body, headers=headers)
        assert_problem(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"


async def test_a_revoked_key_is_401(
    client: httpx.AsyncClient, keys: Keys, db: Database
) -> None:
    async with db.transaction() as conn:
        key = await api_key_create(conn, role="admin", subject="old-admin")
        await conn.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE subject = $1", "old-admin"
        )

    response = await client.get("/v1/pools", headers={"Authorization": f"Bearer {key}"})

    assert_problem(response, 401)


async def test_keys_are_stored_hashed(keys: Keys, db: Database) -> None:
    async with db.connection() as conn:
        stored = await conn.fetch("SELECT * FROM api_keys")
    dumped = repr([dict(row) for row in stored])
    assert len(stored) == len(keys.raw)
    for raw in keys.raw.values():
        assert raw not in dumped


def test_a_full_key_cache_forgets_the_key_that_expires_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth, "KEY_CACHE_SIZE", 3)
    cache = auth.KeyCache(ttl_seconds=10)
    principals = {
        d: auth.Principal(d, "tenant", frozenset({"t"}), frozenset()) for d in "abcd"
    }
    for now, digest in enumerate("abc"):
        cache.put(digest, principals[digest], float(now))
    cache.put("a", principals["a"], 3.0)  # put again: now the last to expire
    cache.put("d", principals["d"], 4.0)  # full: "b" expires first
    assert [d for d in "abcd" if cache.get(d, 5.0) is not None] == ["a", "c", "d"]
