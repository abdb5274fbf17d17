"""Quotas in the previews, over a real HTTP server: the placement preview refuses a spec over
its tenant's quota as a pass would (same code, same numbers), and the drain preview counts
the drained leases' usage as given back and its own predicted placements as taken."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx

from app.db import Database
from app.ledger.leases import pool_leases_revoke
from tests.api.conftest import TENANT_A, TENANT_B, Keys, pool_body

BOTH = [TENANT_A, TENANT_B]


async def _pool(live: httpx.AsyncClient, keys: Keys, pool_id: str, cpu: int) -> None:
    body = pool_body(pool_id, tenantIds=BOTH)
    created = await live.post("/v1/pools", json=body, headers=keys.admin)
    assert created.status_code == 201, created.text
    capacity = {"cpuMillis": cpu, "memoryMiB": 65536, "llmSlots": 0}
    put = await live.put(f"/v1/pools/{pool_id}/capacity", json=capacity, headers=keys.admin)
    assert put.status_code == 200, put.text
    await live.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)


async def _tenant(live: httpx.AsyncClient, keys: Keys, tenant: str, cohort: str,
                  **cpu: int) -> None:
    body = {"cohort": cohort, "quotas": {"gpu-small": {"cpuMillis": cpu}}}
    r = await live.put(f"/v1/tenants/{tenant}", json=body, headers=keys.admin)
    assert r.status_code == 200, r.text


def _spec(cpu: int) -> dict[str, Any]:
    return {"runtimeClass": "gpu-small", "requests": {"cpuMillis": cpu}}


async def _submit(live: httpx.AsyncClient, key: dict[str, str], cpu: int = 1000) -> str:
    r = await live.post("/v1/tasks", json=_spec(cpu), headers=key)
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def _task(live: httpx.AsyncClient, key: dict[str, str], task_id: str) -> dict[str, Any]:
    r = await live.get(f"/v1/tasks/{task_id}", headers=key)
    assert r.status_code == 200, r.text
    return r.json()


async def test_a_preview_over_quota_says_why_as_a_pass_does(
    live: httpx.AsyncClient, keys: Keys, reconcile
) -> None:
    await _pool(live, keys, "pool-x", 32000)
    await _tenant(live, keys, TENANT_A, "c", nominal=4000)
    await _tenant(live, keys, TENANT_B, "c", nominal=2000, borrowingLimit=500)

    # Over its own limit: nominal 2000 + 500 borrowed at most.
    r = await live.post("/v1/placements/preview", json=_spec(3000), headers=keys.tenant_b)
    assert r.status_code == 200, r.text
    preview = r.json()
    assert preview["placement"] is None and preview["candidates"] == []
    assert preview["reason"]["code"] == "quota_exceeded"
    assert preview["reason"]["message"] == (
        "needs 3000m cpu; tenant-b uses 0m of 2000m nominal and may borrow at most 500m")
    # Within it, borrowing 500 of the 4000 a lends: placed.
    r = await live.post("/v1/placements/preview", json=_spec(2500), headers=keys.tenant_b)
    assert r.json()["placement"]["poolId"] == "pool-x"
    # The pass agrees on both, with the same words.
    over = await _submit(live, keys.tenant_b, 3000)
    within = await _submit(live, keys.tenant_b, 2500)
    await reconcile()
    assert (await _task(live, keys.tenant_b, within))["state"] == "LEASED"
    waiting = await _task(live, keys.tenant_b, over)
    assert waiting["pendingReason"]["code"] == "quota_exceeded"
    assert waiting["pendingReason"]["message"] == preview["reason"]["message"]

    # a's nominal is a's, though b borrows 500 of it; beyond it, a's cohort lends nothing
    # (b has nothing unused to lend).
    r = await live.post("/v1/placements/preview", json=_spec(4000), headers=keys.tenant_a)
    assert r.json()["placement"]["poolId"] == "pool-x"
    r = await live.post("/v1/placements/preview", json=_spec(4500), headers=keys.tenant_a)
    assert r.json()["reason"]["code"] == "quota_borrow_unavailable"
    assert r.json()["reason"]["message"] == (
        "needs 4500m cpu; tenant-a uses 0m of 4000m nominal, its cohort can lend 0m now")


async def test_a_preemptor_over_quota_displaces_nothing_in_the_preview(
    live: httpx.AsyncClient, keys: Keys, reconcile
) -> None:
    await _pool(live, keys, "pool-x", 2000)
    await _tenant(live, keys, TENANT_A, "c", nominal=2000, borrowingLimit=0)
    low = [await _submit(live, keys.tenant_a) for _ in range(2)]
    await reconcile()
    assert [(await _task(live, keys.tenant_a, t))["state"] for t in low] == ["LEASED"] * 2
    spec = {**_spec(1000), "priority": 5, "preemption": "lowerPriority"}
    r = await live.post("/v1/placements/preview", json=spec, headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    assert r.json()["reason"]["code"] == "quota_exceeded"
    assert r.json()["preemption"] is None


async def test_the_drain_preview_gives_back_the_drained_usage_and_counts_its_moves(
    live: httpx.AsyncClient, keys: Keys, reconcile, db: Database
) -> None:
    # b (nominal 0) borrows 2000 of a's 3000 on pool-x; then a takes 2000 of its own nominal
    # on pool-y: a's cohort now lends only a's unused 1000.
    await _tenant(live, keys, TENANT_A, "c", nominal=3000)
    await _tenant(live, keys, TENANT_B, "c", nominal=0)
    await _pool(live, keys, "pool-x", 2000)
    borrowed = [await _submit(live, keys.tenant_b) for _ in range(2)]
    assert (await reconcile()).leased == 2
    await _pool(live, keys, "pool-y", 8000)
    own = [await _submit(live, keys.tenant_a) for _ in range(2)]
    assert (await reconcile()).leased == 2
    assert {(await _task(live, keys.tenant_a, t))["lease"]["poolId"] for t in own} == {"pool-y"}

    r = await live.post("/v1/pools/pool-x/drain-preview", headers=keys.operator_x)

    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [i["taskId"] for i in items] == borrowed
    # Revoked, b's leases give back its 2000: the first borrows the 1000 a lends, and the
    # preview counts it, so the second finds nothing left to borrow (pool-y has room).
    assert [i["poolId"] for i in items] == ["pool-y", None]
    assert items[1]["reason"]["code"] == "quota_borrow_unavailable"
    assert items[1]["reason"]["message"] == (
        "needs 1000m cpu; tenant-b uses 1000m of 0m nominal, its cohort can lend 0m now")

    # The real thing: drain, revoke, one pass. It does what the preview said.
    assert (await live.post("/v1/pools/pool-x/drain", headers=keys.operator_x)).status_code == 200
    async with db.transaction() as conn:
        assert await pool_leases_revoke(conn, pool_id="pool-x", now=datetime.now(UTC)) == 2
    assert (await reconcile()).leased == 1
    after = [await _task(live, keys.tenant_b, t) for t in borrowed]
    assert [t["lease"]["poolId"] if t["lease"] else None for t in after] == ["pool-y", None]
    assert after[1]["pendingReason"]["code"] == "quota_borrow_unavailable"
    assert after[1]["pendingReason"]["message"] == items[1]["reason"]["message"]


async def test_the_drain_preview_gives_back_every_level_of_the_tree(
    live: httpx.AsyncClient, keys: Keys, reconcile, db: Database
) -> None:
    # org -> team1 (a lends its 3000) and team2 (b, nominal 0), team2 may borrow 1000 at
    # most. b borrows those 1000 on pool-x; revoked, they come back at every level, so the
    # preview re-places b on pool-y within team2's limit, as the pass then does.
    for cohort, parent, extra in (
        ("org", None, {}), ("team1", "org", {}),
        ("team2", "org", {"quotas": {"gpu-small": {"cpuMillis": {
            "nominal": 0, "borrowingLimit": 1000}}}}),
    ):
        r = await live.put(f"/v1/cohorts/{cohort}", json={"parent": parent, **extra},
                           headers=keys.admin)
        assert r.status_code == 200, r.text
    await _tenant(live, keys, TENANT_A, "team1", nominal=3000)
    await _tenant(live, keys, TENANT_B, "team2", nominal=0)
    await _pool(live, keys, "pool-x", 1000)
    borrowed = await _submit(live, keys.tenant_b)
    assert (await reconcile()).leased == 1
    await _pool(live, keys, "pool-y", 8000)

    r = await live.post("/v1/pools/pool-x/drain-preview", headers=keys.operator_x)

    assert r.status_code == 200, r.text
    assert [(i["taskId"], i["poolId"]) for i in r.json()["items"]] == [(borrowed, "pool-y")]
    assert (await live.post("/v1/pools/pool-x/drain", headers=keys.operator_x)).status_code == 200
    async with db.transaction() as conn:
        assert await pool_leases_revoke(conn, pool_id="pool-x", now=datetime.now(UTC)) == 1
    assert (await reconcile()).leased == 1
    assert (await _task(live, keys.tenant_b, borrowed))["lease"]["poolId"] == "pool-y"
