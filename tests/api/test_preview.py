"""Placement preview: the core on the live snapshot, full explanation, nothing reserved."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from app.api.preview_schemas import PlacementPreview
from app.db import Database
from app.main import create_app
from app.shards import shard_of
from tests.api.conftest import BASE_URL, settings_for_tests

SPEC: dict[str, Any] = {
    "runtimeClass": "gpu-small",
    "requests": {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1},
}


async def heartbeat(db: Database, instance: str, *, age_seconds: float = 0.0) -> None:
    """Record a heartbeat of runtime ``instance`` that is ``age_seconds`` old."""
    at = datetime.now(UTC) - timedelta(seconds=age_seconds)
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO runtime_instances (id, last_heartbeat_at) VALUES ($1, $2) "
            "ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = $2",
            instance, at,
        )


async def ledger_totals(db: Database) -> list[tuple]:
    async with db.connection() as conn:
        return [tuple(r) for r in await conn.fetch(
            "SELECT pool_id, cpu_reserved, memory_reserved, llm_reserved FROM ledgers "
            "ORDER BY pool_id")]


@pytest.fixture
async def pools(pool_make, db: Database) -> None:
    """Pools: big and small for tenant-a (rt-1 fresh), stale on rt-2, hidden for tenant-b."""
    await pool_make("big", capacity={"cpuMillis": 16000, "memoryMiB": 65536, "llmSlots": 8})
    await pool_make("small", capacity={"cpuMillis": 2000, "memoryMiB": 4096, "llmSlots": 2})
    await pool_make("stale", runtimeInstanceId="rt-2")
    await pool_make("hidden", tenant_ids=["tenant-b"],
                    capacity={"cpuMillis": 64000, "memoryMiB": 262144, "llmSlots": 64})
    await heartbeat(db, "rt-1")
    await heartbeat(db, "rt-2", age_seconds=3600)


def pool_ids(preview: dict[str, Any]) -> set[str]:
    """Return every pool id a preview mentions anywhere."""
    ids = {c["poolId"] for c in preview["candidates"]} | {r["poolId"] for r in preview["rejected"]}
    if preview["placement"]:
        p = preview["placement"]
        ids |= {p["poolId"]} | {m["poolId"] for m in p["members"]}
        ids |= {a["poolId"] for a in p["alternatives"]}
    return ids


async def test_preview_ranks_visible_pools_and_reserves_nothing(client, keys, pools, db):
    before = await ledger_totals(db)
    r = await client.post("/v1/placements/preview", json=SPEC, headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    preview = r.json()
    TypeAdapter(PlacementPreview).validate_python(preview)
    assert preview["reason"] is None
    placement = preview["placement"]
    # Spread: the big pool is least loaded after the request.
    assert placement["poolId"] == "big"
    assert placement["members"] == [{"poolId": "big", "count": 1}]
    assert [c["poolId"] for c in preview["candidates"]] == ["big", "small"]
    assert placement["alternatives"] == [
        {"poolId": "small", "score": preview["candidates"][1]["score"]}
    ]
    assert preview["candidates"][0]["score"] >= preview["candidates"][1]["score"]
    names = {c["name"] for c in placement["components"]}
    assert "least_loaded" in names, names
    assert sum(c["value"] for c in placement["components"]) == pytest.approx(
        placement["score"], abs=1e-3
    )
    assert preview["rejected"] == [{"poolId": "stale", "reasons": ["runtime_unhealthy"]}]
    assert "hidden" not in pool_ids(preview)
    assert await ledger_totals(db) == before
    assert (await client.get("/v1/tasks", headers=keys.tenant_a)).json()["items"] == []


async def test_preview_without_a_fit_explains_by_code_and_hides_other_tenants(
    client, keys, pools
):
    too_big = {**SPEC, "requests": {"cpuMillis": 32000}}
    r = await client.post("/v1/placements/preview", json=too_big, headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    preview = r.json()
    assert preview["placement"] is None and preview["candidates"] == []
    reason = preview["reason"]
    # No visible pool has 32000m in all: it can never fit, whatever is released.
    assert reason["code"] == "never_fits"
    # Three visible pools; "hidden" (which would fit) is neither counted nor named.
    assert reason["rejections"] == {"insufficient_cpu": 2, "runtime_unhealthy": 1}
    assert "hidden" not in reason["message"]
    assert {r["poolId"] for r in preview["rejected"]} == {"big", "small", "stale"}
    assert "hidden" not in pool_ids(preview)


async def test_preview_for_a_tenant_with_no_pool(client, keys, pool_make):
    await pool_make("only-b", tenant_ids=["tenant-b"])
    r = await client.post("/v1/placements/preview", json=SPEC, headers=keys.tenant_a)
    assert r.status_code == 200
    preview = r.json()
    assert preview["placement"] is None
    assert preview["reason"]["code"] == "tenant_not_allowed"
    assert preview["reason"]["rejections"] == {}
    assert pool_ids(preview) == set()


async def test_preview_sees_placed_tasks_for_anti_affinity(client, keys, pools, db):
    task_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, state, runtime_class, spec, labels) "
            "VALUES ($1, 'tenant-a', $2, 'LEASED', 'gpu-small', '{}', "
            "'{\"app\": \"db\"}')",
            task_id, shard_of("tenant-a"),
        )
        await conn.execute(
            "INSERT INTO reservations (task_id, pool_id, cpu, memory, llm) "
            "VALUES ($1, 'big', 1000, 1024, 1)",
            task_id,
        )
    spec = {**SPEC, "affinity": {"required": [
        {"selector": {"app": "db"}, "topology": "pool", "anti": True}]}}
    preview = (await client.post("/v1/placements/preview", json=spec,
                                 headers=keys.tenant_a)).json()
    assert preview["placement"]["poolId"] == "small"
    assert {"poolId": "big", "reasons": ["anti_affinity_violated"]} in preview["rejected"]


async def test_preview_validates_like_submit_and_is_for_tenants(client, keys, pools):
    r = await client.post("/v1/placements/preview", json={**SPEC, "extra": 1},
                          headers=keys.tenant_a)
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    for role in ("admin", "operator_x", "runtime_1"):
        r = await client.post("/v1/placements/preview", json=SPEC, headers=keys[role])
        assert r.status_code == 403, role
    r = await client.post("/v1/placements/preview", json=SPEC)
    assert r.status_code == 401


async def test_preview_of_a_preemptor_shows_the_victims_each_candidate_would_need(
    client, keys, pool_make, db: Database
) -> None:
    from app.config import SHARD_SLOTS
    from app.reconciler import Reconciler, ReconcilerConfig

    one = {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1}
    await pool_make("pool-x", capacity=one)
    await pool_make("pool-y", capacity=one, costWeight=5.0)
    await heartbeat(db, "rt-1")
    low = {}
    for priority in (1, 0):
        r = await client.post("/v1/tasks", json={**SPEC, "priority": priority},
                              headers=keys.tenant_a)
        low[priority] = r.json()["id"]
    rec = Reconciler(db, ReconcilerConfig(), owner_id="preview",
                     slots=frozenset(range(SHARD_SLOTS)))
    assert (await rec.run_once(now=datetime.now(UTC))).leased == 2

    body = {**SPEC, "priority": 5, "preemption": "lowerPriority"}
    r = await client.post("/v1/placements/preview", json=body, headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    doc = r.json()
    TypeAdapter(PlacementPreview).validate_python(doc)
    assert doc["placement"] is None and doc["reason"]["code"] == "insufficient_cpu"
    preemption = doc["preemption"]
    # The priority-0 task is the cheaper victim, wherever it runs.
    assert [v["taskId"] for v in preemption["victims"]] == [low[0]]
    # Every candidate pool with the victims it would need, cheapest set first.
    assert [[v["priority"] for v in c["victims"]] for c in preemption["candidates"]] == [
        [0], [1]]
    assert {c["poolId"] for c in preemption["candidates"]} == {"pool-x", "pool-y"}
    assert preemption["poolId"] == preemption["candidates"][0]["poolId"]

    # Without preemption (or at the same priority) nothing would be displaced.
    r = await client.post("/v1/placements/preview", json={**SPEC, "priority": 5},
                          headers=keys.tenant_a)
    assert r.json()["preemption"] is None
    assert await ledger_totals(db) == [("pool-x", 1000, 1024, 1), ("pool-y", 1000, 1024, 1)]


@pytest.fixture(params=[0, 1], ids=["thread", "process"])
async def client_kept(request, db: Database, database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """Yield a client of an app whose previews run in one thread, or one worker process,
    that keeps the pools' snapshot between previews."""
    application = create_app(settings_for_tests(database_url, preview_workers=request.param),
                             db=db)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as http:
            yield http


async def test_each_preview_reflects_every_change_committed_before_it(
    client_kept, client, keys, pools, pool_make, db
):
    async def placed_on() -> tuple[str | None, set[str]]:
        r = await client_kept.post("/v1/placements/preview", json=SPEC, headers=keys.tenant_a)
        assert r.status_code == 200, r.text
        preview = r.json()
        placement = preview["placement"]
        return (placement and placement["poolId"],
                {c["poolId"] for c in preview["candidates"]})

    assert await placed_on() == ("big", {"big", "small"})
    # A ledger row: big shrinks below the request.
    put = await client.put("/v1/pools/big/capacity", headers=keys.admin,
                           json={"cpuMillis": 500, "memoryMiB": 512, "llmSlots": 0})
    assert put.status_code == 200, put.text
    assert await placed_on() == ("small", {"small"})
    # A heartbeat: the stale pool's runtime is fresh again.
    await heartbeat(db, "rt-2")
    assert (await placed_on())[1] == {"small", "stale"}
    # A pool row: small is cordoned.
    r = await client.post("/v1/pools/small/cordon", json={"reason": "test"}, headers=keys.admin)
    assert r.status_code == 200, r.text
    assert (await placed_on())[1] == {"stale"}
    # A pool added.
    await pool_make("huge", capacity={"cpuMillis": 64000, "memoryMiB": 262144, "llmSlots": 64})
    assert await placed_on() == ("huge", {"huge", "stale"})
