"""A 2xx means committed: every write is visible to the very next request, even when commits
are slow, and a failure at COMMIT answers an error with nothing half-written.

These run against a real `berth serve` process over a real socket: an in-process ASGI client
waits for the whole application call, so it cannot see an answer sent before the COMMIT.
The fault is injected *at commit* by a deferred constraint trigger on every table a write
touches; it acts only on the server's connections (application name ``berth-api``), so the
test's own reads and set-up run at normal speed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.keys import api_key_create
from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from tests.factories import berth_serving, heartbeat_add, spec_make

pytestmark = pytest.mark.slow

#: Tables a write endpoint can touch; each gets the commit-time fault trigger.
WRITTEN_TABLES = (
    "pools", "ledgers", "runtime_instances", "tasks", "task_events", "leases",
    "reservations", "idempotency_records", "api_keys", "tenant_queue_counts", "tenants",
    "tenant_quotas",
)
#: How long each written row holds up its COMMIT in "slow" mode.
SLOW_ROW_SECONDS = 0.05

FAULT_INSTALL = f"""
CREATE TABLE IF NOT EXISTS berth_test_commit_fault (mode text NOT NULL);
CREATE OR REPLACE FUNCTION berth_test_commit_fault() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE m text;
BEGIN
    IF current_setting('application_name') <> 'berth-api' THEN RETURN NULL; END IF;
    SELECT mode INTO m FROM berth_test_commit_fault LIMIT 1;
    IF m = 'slow' THEN
        PERFORM pg_sleep({SLOW_ROW_SECONDS});
    ELSIF m = 'fail' THEN
        RAISE EXCEPTION 'injected failure at commit' USING ERRCODE = 'serialization_failure';
    ELSIF m = 'conflict' THEN
        RAISE EXCEPTION 'injected conflict at commit' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
""" + "".join(
    f"CREATE CONSTRAINT TRIGGER berth_test_commit_fault AFTER INSERT OR UPDATE OR DELETE ON "
    f"{t} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "
    f"berth_test_commit_fault();\n"
    for t in WRITTEN_TABLES
)
FAULT_REMOVE = "".join(
    f"DROP TRIGGER IF EXISTS berth_test_commit_fault ON {t};\n" for t in WRITTEN_TABLES
) + (
    "DROP FUNCTION IF EXISTS berth_test_commit_fault();"
    "DROP TABLE IF EXISTS berth_test_commit_fault;"
)


@dataclass
class Live:
    """A running `berth serve` on the test database, with keys and a fault switch."""

    http: httpx.AsyncClient
    db: Database
    admin: dict[str, str]
    tenant: dict[str, str]
    runtime: dict[str, str]

    async def fault(self, mode: str | None) -> None:
        """Set the commit fault: None, "slow", "fail" or "conflict"."""
        async with self.db.transaction() as conn:
            await conn.execute("DELETE FROM berth_test_commit_fault")
            if mode is not None:
                await conn.execute("INSERT INTO berth_test_commit_fault VALUES ($1)", mode)

    async def state(self) -> dict[str, Any]:
        """Return every row of every written table (the whole visible state)."""
        out: dict[str, Any] = {}
        async with self.db.connection() as conn:
            for table in WRITTEN_TABLES:
                rows = await conn.fetch(f"SELECT * FROM {table}")
                out[table] = sorted(repr(sorted(dict(r).items())) for r in rows)
        return out


@pytest_asyncio.fixture
async def live(db: Database, database_url: str) -> AsyncIterator[Live]:
    """Yield a live server on the clean test database, the fault trigger installed."""
    async with db.connection() as conn:
        await conn.execute(FAULT_REMOVE)
        await conn.execute(FAULT_INSTALL)
    keys = {}
    async with db.transaction() as conn:
        for role, subject, tenants, instances in (
            ("admin", "root", [], []),
            ("tenant", "acme-app", ["acme"], []),
            ("runtime", "rt", [], ["rt-p1"]),
        ):
            keys[role] = await api_key_create(
                conn, role=role, subject=subject, tenant_ids=tenants,
                runtime_instance_ids=instances,
            )
    try:
        async with berth_serving(database_url) as base, httpx.AsyncClient(
            base_url=base, timeout=30
        ) as http:
            yield Live(
                http, db,
                *({"Authorization": f"Bearer {keys[r]}"} for r in ("admin", "tenant", "runtime")),
            )
    finally:
        async with db.connection() as conn:
            await conn.execute(FAULT_REMOVE)


POOL = {
    "id": "p1", "tenantIds": ["acme"], "runtimeClass": "standard",
    "runtimeInstanceId": "rt-p1", "region": "eu-west", "operators": ["ops"],
}
CAPACITY = {"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 0}


async def _pool(live: Live, *, capacity: bool = True) -> None:
    await live.fault(None)
    assert (await live.http.post("/v1/pools", json=POOL, headers=live.admin)).status_code == 201
    if capacity:
        r = await live.http.put("/v1/pools/p1/capacity", json=CAPACITY, headers=live.admin)
        assert r.status_code == 200, r.text


async def _task(live: Live) -> str:
    await live.fault(None)
    r = await live.http.post("/v1/tasks", json=spec_make(cpu=100), headers=live.tenant)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@dataclass(frozen=True)
class Write:
    """One write endpoint: its set-up, the request, and the read that must show its effect."""

    name: str
    setup: Callable[[Live], Awaitable[dict[str, Any]]]
    request: Callable[[Live, dict[str, Any]], Awaitable[httpx.Response]]
    visible: Callable[[Live, dict[str, Any]], Awaitable[bool]]


async def _nothing(live: Live) -> dict[str, Any]:
    return {}


async def _with_pool(live: Live) -> dict[str, Any]:
    await _pool(live)
    return {}


async def _with_bare_pool(live: Live) -> dict[str, Any]:
    await _pool(live, capacity=False)
    return {}


async def _with_task(live: Live) -> dict[str, Any]:
    return {"task": await _task(live)}


async def _with_cordoned_pool(live: Live) -> dict[str, Any]:
    await _pool(live)
    assert (await live.http.post("/v1/pools/p1/cordon", headers=live.admin)).status_code == 200
    return {}


async def _with_lease(live: Live) -> dict[str, Any]:
    """Lease a task on p1: a real reconciler pass on the test's own (fault-free) connections."""
    await _pool(live)
    r = await live.http.post("/v1/runtimes/rt-p1/heartbeat", headers=live.runtime)
    assert r.status_code == 200, r.text
    task = await _task(live)
    reconciler = Reconciler(live.db, ReconcilerConfig(), owner_id="commit-test",
                            slots=frozenset(range(SHARD_SLOTS)))
    assert (await reconciler.run_once(now=datetime.now(UTC))).leased == 1
    view = (await live.http.get(f"/v1/tasks/{task}", headers=live.tenant)).json()
    return {"task": task, "lease": view["lease"]["id"], "epoch": view["lease"]["epoch"]}


NEW_KEY = {"role": "operator", "subject": "commit-test-ops"}


async def _with_key(live: Live) -> dict[str, Any]:
    await live.fault(None)
    r = await live.http.post("/v1/keys", json=NEW_KEY, headers=live.admin)
    assert r.status_code == 201, r.text
    return {"key": r.json()["id"]}


async def _visible_key(live: Live, check: Callable[[dict[str, Any] | None], bool]) -> bool:
    r = await live.http.get("/v1/keys", headers=live.admin)
    found = [k for k in r.json()["items"] if k["subject"] == NEW_KEY["subject"]]
    return r.status_code == 200 and check(found[0] if found else None)


async def _pool_json(live: Live) -> dict[str, Any] | None:
    r = await live.http.get("/v1/pools/p1", headers=live.admin)
    return r.json() if r.status_code == 200 else None


WRITES = [
    Write(
        "createPool", _nothing,
        lambda live, _: live.http.post("/v1/pools", json=POOL, headers=live.admin),
        lambda live, _: _visible_pool(live, lambda p: p is not None),
    ),
    Write(
        "updatePool", _with_pool,
        lambda live, _: live.http.patch(
            "/v1/pools/p1", json={"region": "us-east"}, headers=live.admin
        ),
        lambda live, _: _visible_pool(live, lambda p: p is not None and p["region"] == "us-east"),
    ),
    Write(
        "putPoolCapacity", _with_bare_pool,
        lambda live, _: live.http.put("/v1/pools/p1/capacity", json=CAPACITY, headers=live.admin),
        lambda live, _: _visible_pool(
            live, lambda p: p is not None and p["capacity"] == CAPACITY
        ),
    ),
    Write(
        "cordonPool", _with_pool,
        lambda live, _: live.http.post("/v1/pools/p1/cordon", headers=live.admin),
        lambda live, _: _visible_pool(live, lambda p: p is not None and p["status"] == "CORDONED"),
    ),
    Write(
        "drainPool", _with_pool,
        lambda live, _: live.http.post("/v1/pools/p1/drain", headers=live.admin),
        lambda live, _: _visible_pool(live, lambda p: p is not None and p["status"] == "DRAINING"),
    ),
    Write(
        "activatePool", _with_cordoned_pool,
        lambda live, _: live.http.post("/v1/pools/p1/activate", headers=live.admin),
        lambda live, _: _visible_pool(live, lambda p: p is not None and p["status"] == "ACTIVE"),
    ),
    Write(
        "deletePool", _with_pool,
        lambda live, _: live.http.delete("/v1/pools/p1", headers=live.admin),
        lambda live, _: _visible_pool(live, lambda p: p is None),
    ),
    Write(
        "createTask", _nothing,
        lambda live, _: live.http.post("/v1/tasks", json=spec_make(cpu=100), headers=live.tenant),
        lambda live, _: _visible_tasks(live, lambda items: len(items) == 1),
    ),
    Write(
        "createTaskBatch", _nothing,
        lambda live, _: live.http.post(
            "/v1/task-batches",
            json={"items": [{"spec": spec_make(cpu=100)}, {"spec": spec_make(cpu=200),
                                                           "idempotencyKey": "batch-1"}]},
            headers=live.tenant,
        ),
        lambda live, _: _visible_tasks(live, lambda items: len(items) == 2),
    ),
    Write(
        "cancelTask", _with_task,
        lambda live, ctx: live.http.post(f"/v1/tasks/{ctx['task']}/cancel", headers=live.tenant),
        lambda live, ctx: _visible_tasks(
            live, lambda items: [t["state"] for t in items] == ["CANCELLED"]
        ),
    ),
    Write(
        "completeLease", _with_lease,
        lambda live, ctx: live.http.post(
            f"/v1/leases/{ctx['lease']}/complete",
            json={"outcome": "succeeded", "epoch": ctx["epoch"]},
            headers=live.runtime,
        ),
        lambda live, ctx: _visible_tasks(
            live, lambda items: [t["state"] for t in items] == ["SUCCEEDED"]
        ),
    ),
    Write(
        "createKey", _nothing,
        lambda live, _: live.http.post("/v1/keys", json=NEW_KEY, headers=live.admin),
        lambda live, _: _visible_key(live, lambda k: k is not None),
    ),
    Write(
        "revokeKey", _with_key,
        lambda live, ctx: live.http.delete(f"/v1/keys/{ctx['key']}", headers=live.admin),
        lambda live, _: _visible_key(live, lambda k: k is not None and k["revokedAt"] is not None),
    ),
    Write(
        "putTenant", _nothing,
        lambda live, _: live.http.put("/v1/tenants/acme", json=TENANT_SETTINGS,
                                      headers=live.admin),
        lambda live, _: _visible_tenant(live),
    ),
    Write(
        "heartbeatRuntime", _nothing,
        lambda live, _: live.http.post("/v1/runtimes/rt-p1/heartbeat", headers=live.runtime),
        lambda live, _: _visible_heartbeat(live),
    ),
]


async def _visible_pool(live: Live, check: Callable[[dict[str, Any] | None], bool]) -> bool:
    return check(await _pool_json(live))


async def _visible_tasks(live: Live, check: Callable[[list[dict[str, Any]]], bool]) -> bool:
    r = await live.http.get("/v1/tasks", headers=live.tenant)
    return r.status_code == 200 and check(r.json()["items"])


TENANT_SETTINGS = {"cohort": "c1", "quotas": {"py": {"cpuMillis": {"nominal": 2000}}}}


async def _visible_tenant(live: Live) -> bool:
    r = await live.http.get("/v1/tenants/acme", headers=live.admin)
    return r.status_code == 200 and r.json()["quotas"] == {
        "py": {"cpuMillis": {"nominal": 2000, "borrowingLimit": None, "lendingLimit": None}}}


async def _visible_heartbeat(live: Live) -> bool:
    async with live.db.connection() as conn:
        at = await conn.fetchval("SELECT last_heartbeat_at FROM runtime_instances WHERE id = $1",
                                 "rt-p1")
    return at is not None


@pytest.mark.parametrize("write", WRITES, ids=lambda w: w.name)
async def test_a_write_is_visible_to_the_very_next_request_when_commits_are_slow(
    live: Live, write: Write
) -> None:
    ctx = await write.setup(live)
    await live.fault("slow")
    started = time.monotonic()
    response = await write.request(live, ctx)
    took = time.monotonic() - started
    assert 200 <= response.status_code < 300, response.text
    # The commit really was slow, and the answer waited for it.
    assert took >= SLOW_ROW_SECONDS, took
    await live.fault(None)
    assert await write.visible(live, ctx), f"{write.name}: 2xx but its change is not visible"


@pytest.mark.parametrize(("mode", "status"), [("fail", 503), ("conflict", 409)])
@pytest.mark.parametrize("write", WRITES, ids=lambda w: w.name)
async def test_a_failure_at_commit_answers_an_error_and_writes_nothing(
    live: Live, write: Write, mode: str, status: int
) -> None:
    ctx = await write.setup(live)
    before = await live.state()
    await live.fault(mode)
    response = await write.request(live, ctx)
    await live.fault(None)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    if status == 503:
        assert response.headers.get("retry-after")
    assert await live.state() == before, f"{write.name}: a failed commit left rows behind"
    assert not await write.visible(live, ctx)


async def test_the_fault_trigger_acts_only_on_the_server(live: Live) -> None:
    await live.fault("fail")
    async with live.db.transaction() as conn:
        await heartbeat_add(conn, "rt-other")
    await live.fault(None)
    async with live.db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM runtime_instances") == 1
