"""Keys over the API: list without secrets, create once-shown secrets, revoke with a bounded
cache window, the last-admin guard, and last use recorded at most once a minute."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from app.auth import KEY_CACHE_SECONDS, KeyCache
from app.db import Database
from app.ledger.keys import api_key_create
from tests.api.conftest import Keys, assert_problem

RFC3339_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 100}}


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(app: FastAPI) -> Clock:
    """Give the app a key cache on a clock the test controls."""
    fake = Clock()
    app.state.key_cache = KeyCache(clock=fake)
    return fake


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def create(client: httpx.AsyncClient, keys: Keys, **body: object) -> httpx.Response:
    return await client.post("/v1/keys", json=body, headers=keys.admin)


async def test_create_shows_the_secret_once_and_the_key_works(
    client: httpx.AsyncClient, keys: Keys, db: Database
) -> None:
    made = await create(client, keys, role="tenant", subject="acme-ci", tenantIds=["tenant-a"])
    assert made.status_code == 201, made.text
    body = made.json()
    secret = body["key"]
    assert secret.startswith("berth_") and secret.startswith(body["prefix"])
    assert made.headers["location"] == f"/v1/keys/{body['id']}"
    assert (body["role"], body["subject"], body["tenantIds"]) == ("tenant", "acme-ci",
                                                                  ["tenant-a"])
    assert body["runtimeInstanceIds"] == [] and body["revokedAt"] is None
    assert body["lastUsedAt"] is None and RFC3339_Z.match(body["createdAt"]), body

    submitted = await client.post("/v1/tasks", json=SPEC, headers=bearer(secret))
    assert submitted.status_code == 201, submitted.text

    listed = await client.get("/v1/keys", headers=keys.admin)
    assert listed.status_code == 200
    assert secret not in listed.text
    async with db.connection() as conn:
        digest = await conn.fetchval("SELECT key_hash FROM api_keys WHERE id = $1::uuid",
                                     body["id"])
    assert digest not in listed.text, "a list never shows a hash either"
    item = next(k for k in listed.json()["items"] if k["id"] == body["id"])
    assert "key" not in item
    assert item["prefix"] == body["prefix"]
    assert RFC3339_Z.match(item["lastUsedAt"]), "the key's use was recorded"
    assert set(item) == {"id", "prefix", "role", "subject", "tenantIds", "runtimeInstanceIds",
                         "createdAt", "lastUsedAt", "revokedAt"}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param({"role": "tenant", "subject": "s"}, "at least one", id="tenant-no-tenant"),
        pytest.param({"role": "runtime", "subject": "s"}, "at least one", id="runtime-no-instance"),
        pytest.param({"role": "admin", "subject": "s", "tenantIds": ["t"]},
                     "tenant and operator keys only", id="admin-with-tenant"),
        pytest.param({"role": "operator", "subject": "s", "runtimeInstanceIds": ["i"]},
                     "runtime keys only", id="operator-with-instance"),
        pytest.param({"role": "tenant", "subject": "   ", "tenantIds": ["t"]}, "subject",
                     id="blank-subject"),
        pytest.param({"role": "root", "subject": "s"}, "", id="unknown-role"),
        pytest.param({"role": "admin", "subject": "s", "extra": 1}, "", id="unknown-field"),
        pytest.param({"role": "admin"}, "", id="no-subject"),
    ],
)
async def test_create_refuses_a_key_whose_scope_does_not_fit_its_role(
    client: httpx.AsyncClient, keys: Keys, db: Database, body: dict, needle: str
) -> None:
    response = await client.post("/v1/keys", json=body, headers=keys.admin)
    problem = assert_problem(response, 422)
    assert needle in problem["detail"] or needle in str(problem.get("errors")), problem
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM api_keys") == len(keys.raw)


@pytest.mark.parametrize("who", ["tenant_a", "operator_x", "runtime_1"])
async def test_only_admins_manage_keys(client: httpx.AsyncClient, keys: Keys, who: str) -> None:
    headers = keys[who]
    assert_problem(await client.get("/v1/keys", headers=headers), 403)
    made = await client.post("/v1/keys", json={"role": "admin", "subject": "x"}, headers=headers)
    assert_problem(made, 403)
    listed = (await client.get("/v1/keys", headers=keys.admin)).json()["items"]
    assert_problem(await client.delete(f"/v1/keys/{listed[0]['id']}", headers=headers), 403)
    assert_problem(await client.get("/v1/keys"), 401)


async def test_list_pages_in_creation_order_and_can_leave_out_revoked_keys(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    made = [(await create(client, keys, role="operator", subject=f"op-{i}")).json()
            for i in range(5)]
    await client.delete(f"/v1/keys/{made[1]['id']}", headers=keys.admin)
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/keys", params=params, headers=keys.admin)).json()
        assert len(page["items"]) <= 3
        seen += [k["id"] for k in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == len(keys.raw) + 5
    assert seen[-5:] == [m["id"] for m in made]
    active = (await client.get("/v1/keys", params={"includeRevoked": "false", "limit": 500},
                               headers=keys.admin)).json()["items"]
    assert made[1]["id"] not in {k["id"] for k in active}
    assert len(active) == len(keys.raw) + 4
    assert_problem(await client.get("/v1/keys", params={"cursor": "bm9wZQ"},
                                    headers=keys.admin), 400)


async def test_revoke_stops_the_key_at_once_on_this_process(
    client: httpx.AsyncClient, keys: Keys, clock: Clock
) -> None:
    made = (await create(client, keys, role="tenant", subject="ci", tenantIds=["tenant-a"])).json()
    assert (await client.get("/v1/tasks", headers=bearer(made["key"]))).status_code == 200

    revoked = await client.delete(f"/v1/keys/{made['id']}", headers=keys.admin)
    assert revoked.status_code == 200, revoked.text
    assert RFC3339_Z.match(revoked.json()["revokedAt"])
    # Cached a moment ago, yet refused at once: the revoking process forgot it.
    assert_problem(await client.get("/v1/tasks", headers=bearer(made["key"])), 401)

    again = await client.delete(f"/v1/keys/{made['id']}", headers=keys.admin)
    assert again.status_code == 200 and again.json() == revoked.json()


async def test_a_key_revoked_elsewhere_stops_working_after_the_cache_window(
    client: httpx.AsyncClient, keys: Keys, db: Database, clock: Clock
) -> None:
    made = (await create(client, keys, role="tenant", subject="ci", tenantIds=["tenant-a"])).json()
    assert (await client.get("/v1/tasks", headers=bearer(made["key"]))).status_code == 200
    # Revoked by another process (another API replica, or `berth keys revoke`).
    async with db.connection() as conn:
        await conn.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1::uuid",
                           made["id"])

    clock.now += KEY_CACHE_SECONDS - 0.5
    cached = await client.get("/v1/tasks", headers=bearer(made["key"]))
    assert cached.status_code == 200, "inside the window the cached key still works"
    clock.now += 1.0
    assert_problem(await client.get("/v1/tasks", headers=bearer(made["key"])), 401)


async def test_unknown_and_malformed_key_ids_are_404(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    for key_id in ("00000000-0000-4000-8000-000000000000", "not-a-uuid"):
        problem = assert_problem(await client.delete(f"/v1/keys/{key_id}", headers=keys.admin),
                                 404)
        assert problem["type"].endswith("/key-not-found")


async def admin_id(client: httpx.AsyncClient, headers: dict[str, str], subject: str) -> str:
    items = (await client.get("/v1/keys", params={"limit": 500}, headers=headers)).json()["items"]
    return next(k["id"] for k in items if k["subject"] == subject and k["role"] == "admin")


async def test_the_last_live_admin_key_cannot_be_revoked(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    first = await admin_id(client, keys.admin, "admin")
    problem = assert_problem(await client.delete(f"/v1/keys/{first}", headers=keys.admin), 409)
    assert problem["type"].endswith("/last-admin-key")

    second = (await create(client, keys, role="admin", subject="admin-2")).json()
    assert (await client.delete(f"/v1/keys/{first}", headers=keys.admin)).status_code == 200
    # The first key is gone; the second cannot revoke itself, being the last.
    assert_problem(await client.get("/v1/keys", headers=keys.admin), 401)
    mine = bearer(second["key"])
    assert_problem(await client.delete(f"/v1/keys/{second['id']}", headers=mine), 409)
    assert (await client.get("/v1/keys", headers=mine)).status_code == 200


async def test_two_admins_revoking_each_other_at_once_leave_one_admin(
    client: httpx.AsyncClient, keys: Keys, db: Database
) -> None:
    for _ in range(5):
        async with db.connection() as conn:
            await conn.execute("DELETE FROM api_keys WHERE role = 'admin' AND subject <> 'admin'")
            await conn.execute("UPDATE api_keys SET revoked_at = NULL")
        b = (await create(client, keys, role="admin", subject="admin-b")).json()
        # Both keys verified (and cached) first, so that the two revocations really race
        # inside their transactions rather than one failing authentication.
        a_id = await admin_id(client, keys.admin, "admin")
        assert (await client.get("/v1/keys", headers=bearer(b["key"]))).status_code == 200
        answers = await asyncio.gather(
            client.delete(f"/v1/keys/{b['id']}", headers=keys.admin),
            client.delete(f"/v1/keys/{a_id}", headers=bearer(b["key"])),
        )
        assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
        async with db.connection() as conn:
            live = await conn.fetchval(
                "SELECT count(*) FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL"
            )
        assert live == 1


async def test_last_use_is_written_at_most_once_a_minute(
    client: httpx.AsyncClient, keys: Keys, db: Database, clock: Clock
) -> None:
    async with db.transaction() as conn:
        key = await api_key_create(conn, role="tenant", subject="busy", tenant_ids=["tenant-a"])

    async def last_used() -> datetime | None:
        async with db.connection() as conn:
            return await conn.fetchval(
                "SELECT last_used_at FROM api_keys WHERE subject = 'busy'"
            )

    assert await last_used() is None
    assert (await client.get("/v1/tasks", headers=bearer(key))).status_code == 200
    first = await last_used()
    assert first is not None and datetime.now(UTC) - first < timedelta(seconds=30)
    for _ in range(10):
        clock.now += KEY_CACHE_SECONDS + 1  # every request misses the cache and reads the key
        assert (await client.get("/v1/tasks", headers=bearer(key))).status_code == 200
    assert await last_used() == first, "no second write within the minute"
    # Pretend the minute passed: the next cache miss records the use again.
    async with db.connection() as conn:
        await conn.execute("UPDATE api_keys SET last_used_at = $1 WHERE subject = 'busy'",
                           first - timedelta(seconds=61))
    for _ in range(3):
        clock.now += KEY_CACHE_SECONDS + 1
        assert (await client.get("/v1/tasks", headers=bearer(key))).status_code == 200
    assert await last_used() > first
