"""API test fixtures: the ASGI app on a clean database, an httpx client and one key per role.

Fixtures (names are stable; other API tests rely on them):

* ``app``: ``create_app(...)`` on the session's test database, its lifespan entered, on a clean
  database (every table truncated), with the in-process reconciler off;
* ``client``: an ``httpx.AsyncClient`` talking to ``app`` through ``httpx.ASGITransport``
  (base URL ``http://berth.test``);
* ``keys``: a :class:`Keys` with the ``Authorization`` headers of one key per role —
  ``keys.admin``, ``keys.tenant_a`` (tenant ``tenant-a``), ``keys.tenant_b`` (tenant
  ``tenant-b``), ``keys.operator_x`` (subject ``operator-x``, operates pool ``pool-x`` once
  a test creates it with ``operators=["operator-x"]``), ``keys.operator_y`` (subject
  ``operator-y``), ``keys.runtime_1`` (instance ``rt-1``) and ``keys.runtime_2`` (instance
  ``rt-2``); ``keys["admin"]`` works too, and ``keys.raw["admin"]`` is the bare key;
* ``assert_problem(response, status)`` (a function, import it): checks an RFC 9457 body;
* ``pool_make``: an async helper that creates a pool through the API as admin and, unless
  told otherwise, registers its capacity — ``await pool_make("pool-x", tenant_ids=[...])``;
* ``reconciler`` (every shard slot, the app's settings; a module overrides it for others)
  and ``reconcile``, a function running one pass of it now;
* ``live``: an ``httpx.AsyncClient`` of a real Berth server (uvicorn in a thread) on the
  same database, keys made.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from app.config import SHARD_SLOTS, Settings
from app.db import Database
from app.ledger.keys import api_key_create
from app.ledger.wakeups import CHANNEL
from app.main import create_app
from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler

BASE_URL = "http://berth.test"
PROBLEM_JSON = "application/problem+json"

TENANT_A = "tenant-a"
TENANT_B = "tenant-b"
OPERATOR_X = "operator-x"
OPERATOR_Y = "operator-y"
RUNTIME_1 = "rt-1"
RUNTIME_2 = "rt-2"

#: (fixture attribute, role, subject, tenant ids, runtime instance ids)
KEY_SPECS: tuple[tuple[str, str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("admin", "admin", "admin", (), ()),
    ("tenant_a", "tenant", TENANT_A, (TENANT_A,), ()),
    ("tenant_b", "tenant", TENANT_B, (TENANT_B,), ()),
    ("operator_x", "operator", OPERATOR_X, (), ()),
    ("operator_y", "operator", OPERATOR_Y, (), ()),
    ("runtime_1", "runtime", "runtime-1", (), (RUNTIME_1,)),
    ("runtime_2", "runtime", "runtime-2", (), (RUNTIME_2,)),
)


@dataclass
class Keys:
    """Authorization headers of one API key per role, by name (attribute or item)."""

    raw: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> dict[str, str]:
        raw = self.__dict__.get("raw", {})
        if name not in raw:
            raise AttributeError(name)
        return {"Authorization": f"Bearer {raw[name]}"}

    def __getitem__(self, name: str) -> dict[str, str]:
        return getattr(self, name)


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """Assert ``response`` is an RFC 9457 problem with ``status`` and return its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers
    body = response.json()
    assert body["status"] == status, body
    assert body["title"] and body["detail"] and body["type"], body
    return body


def settings_for_tests(database_url: str, **overrides: Any) -> Settings:
    """Return Settings for an API test app: the test database, no in-process reconciler,
    previews computed in a thread (starting worker processes for every test's app would cost
    more than the tests; tests/api/test_event_loop.py runs them in processes)."""
    values: dict[str, Any] = {
        "database_url": database_url, "reconciler_enabled": False, "preview_workers": 0,
    }
    values.update(overrides)
    return Settings(**values)


@pytest_asyncio.fixture
async def app(db: Database, database_url: str) -> AsyncIterator[FastAPI]:
    """Yield the Berth app on a clean test database, with its lifespan running."""
    application = create_app(settings_for_tests(database_url), db=db)
    async with application.router.lifespan_context(application):
        yield application


@pytest_asyncio.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Yield an httpx client that calls ``app`` in-process."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as http:
        yield http


@pytest_asyncio.fixture
async def keys(app: FastAPI, db: Database) -> Keys:
    """Create one API key per role and return their Authorization headers."""
    created = Keys()
    async with db.transaction() as conn:
        for name, role, subject, tenant_ids, instance_ids in KEY_SPECS:
            created.raw[name] = await api_key_create(
                conn,
                role=role,
                subject=subject,
                tenant_ids=tenant_ids,
                runtime_instance_ids=instance_ids,
            )
    return created


def pool_body(pool_id: str, **fields: Any) -> dict[str, Any]:
    """Return a valid createPool body for ``pool_id``; ``fields`` (camelCase) override."""
    body: dict[str, Any] = {
        "id": pool_id,
        "tenantIds": [TENANT_A],
        "runtimeClass": "gpu-small",
        "runtimeInstanceId": RUNTIME_1,
        "region": "eu-west",
        "dataResidency": "eu",
        "failureDomain": "fd-1",
        "labels": {"tier": "standard"},
        "artifactRegions": ["eu-west"],
        "costWeight": 1.0,
        "operators": [OPERATOR_X],
    }
    body.update(fields)
    return body


PoolMaker = Callable[..., Awaitable[dict[str, Any]]]


@pytest_asyncio.fixture
async def pool_make(client: httpx.AsyncClient, keys: Keys) -> PoolMaker:
    """Return an async helper that creates a pool (and its capacity) through the API."""

    async def make(
        pool_id: str,
        *,
        tenant_ids: Sequence[str] = (TENANT_A,),
        capacity: Mapping[str, int] | None = None,
        register_capacity: bool = True,
        **fields: Any,
    ) -> dict[str, Any]:
        body = pool_body(pool_id, tenantIds=list(tenant_ids), **fields)
        created = await client.post("/v1/pools", json=body, headers=keys.admin)
        assert created.status_code == 201, created.text
        if not register_capacity:
            return created.json()
        totals = dict(capacity or {"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 4})
        put = await client.put(f"/v1/pools/{pool_id}/capacity", json=totals, headers=keys.admin)
        assert put.status_code == 200, put.text
        return put.json()

    return make


@pytest_asyncio.fixture
async def wakeups(db: Database) -> AsyncIterator[asyncio.Queue[str]]:
    """Yield a queue of the wakeup sources notified on the database from now on."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    conn = await db.connect(application_name="berth-test-listener")

    def received(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        queue.put_nowait(payload)

    try:
        await conn.add_listener(CHANNEL, received)
        yield queue
    finally:
        await conn.close()


@pytest.fixture
def reconciler(app: FastAPI, db: Database) -> Reconciler:
    """Return a reconciler over every shard slot with the app's settings (a test module
    overrides this fixture for other settings)."""
    config = ReconcilerConfig.from_settings(app.state.settings)
    return Reconciler(db, config, owner_id="api-test", slots=frozenset(range(SHARD_SLOTS)))


@pytest.fixture
def reconcile(reconciler: Reconciler) -> Callable[[], Awaitable[Any]]:
    """Return a function running one pass of ``reconciler`` now."""

    async def run() -> Any:
        return await reconciler.run_once(now=datetime.now(UTC))

    return run


@pytest_asyncio.fixture
async def live(app: FastAPI, keys: Keys, database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """Yield a client of a real Berth server on the clean test database (keys made)."""
    from tests.api.live import live_server  # it imports this module

    with live_server(database_url) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            yield http
