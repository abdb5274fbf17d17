"""Reclaim through the API and a reconciler: a tenant back under its nominal gets exactly its
share from a borrower of its cohort within one grace period when the runtime releases at
once; the victims are requeued without using an attempt and wait for quota; usage rows,
events and metrics follow."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI

from app.config import SHARD_SLOTS
from app.ledger.invariants import ledger_check
from app.metrics import RECLAIM_VICTIMS, RECLAIMS, TASKS_PENDING
from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from tests.api.conftest import TENANT_A, TENANT_B
from tests.factories import ledger_violations

GRACE = 30.0


@pytest.fixture
def reconciler(app: FastAPI, db) -> Reconciler:
    config = ReconcilerConfig.from_settings(app.state.settings,
                                            preemption_grace_seconds=GRACE)
    return Reconciler(db, config, owner_id="reclaim-test", slots=frozenset(range(SHARD_SLOTS)))


@pytest.fixture
async def shared(client, keys, pool_make):
    """One pool of 8 cores of class gpu-small open to both tenants, its runtime healthy;
    each tenant has a nominal of 4 cores in cohort c."""
    await pool_make("pool-x", tenant_ids=[TENANT_A, TENANT_B],
                    capacity={"cpuMillis": 8000, "memoryMiB": 65536, "llmSlots": 0})
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    for tenant in (TENANT_A, TENANT_B):
        body = {"cohort": "c", "quotas": {"gpu-small": {"cpuMillis": {"nominal": 4000}}}}
        r = await client.put(f"/v1/tenants/{tenant}", json=body, headers=keys.admin)
        assert r.status_code == 200, r.text


async def submit(client, keys, tenant_key: str, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = await client.post("/v1/tasks", json={"runtimeClass": "gpu-small",
                                                 "requests": {"cpuMillis": 1000}},
                              headers=keys[tenant_key])
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


async def get(client, keys, tenant_key: str, task_id: str) -> dict:
    r = await client.get(f"/v1/tasks/{task_id}", headers=keys[tenant_key])
    assert r.status_code == 200, r.text
    return r.json()


async def used(client, keys, tenant: str, tenant_key: str) -> int:
    r = await client.get(f"/v1/tenants/{tenant}", headers=keys[tenant_key])
    return r.json()["usage"]["gpu-small"]["used"]["cpuMillis"]


async def sound(db) -> None:
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        assert {k: v for k, v in (await ledger_check(conn)).items() if v} == {}


async def test_a_tenant_back_under_its_nominal_gets_its_share_within_one_grace_period(
    client, keys, shared, reconciler, db
):
    # a borrows b's whole nominal: 8 tasks on the 8 cores.
    a = await submit(client, keys, "tenant_a", 8)
    assert (await reconciler.run_once(now=datetime.now(UTC))).leased == 8
    assert await used(client, keys, TENANT_A, "tenant_a") == 8000
    started = RECLAIMS.labels(outcome="started")._value.get()
    victims_before = RECLAIM_VICTIMS._value.get()

    # b wants 3 of its 4 cores back: exactly 3 of a's borrowed leases are revoked.
    b = await submit(client, keys, "tenant_b", 3)
    t0 = datetime.now(UTC)
    result = await reconciler.run_once(now=t0)
    assert result.reclaims["started"] == 3 and result.leased == 0
    assert RECLAIMS.labels(outcome="started")._value.get() == started + 3
    assert RECLAIM_VICTIMS._value.get() == victims_before + 3
    for task_id in b:
        pending = (await get(client, keys, "tenant_b", task_id))["pendingReason"]
        assert pending["code"] == "reclaiming"
        assert pending["victims"] == 1
    await reconciler.queue_gauges_refresh()
    assert TASKS_PENDING.labels(reason="reclaiming")._value.get() == 3
    await sound(db)

    # The runtime sees the revoking leases in its heartbeat and releases them at once.
    beat = (await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)).json()
    revoking = beat["revoking"]
    assert len(revoking) == 3
    victims = []
    for item in revoking:
        victims.append(item["taskId"])
        r = await client.post(f"/v1/leases/{item['leaseId']}/complete",
                              json={"outcome": "released", "epoch": item["epoch"]},
                              headers=keys.runtime_1)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "ADMITTED"
    assert set(victims) <= set(a)
    await sound(db)

    # The next pass, well within the grace period: b's three tasks lease.
    result = await reconciler.run_once(now=t0 + timedelta(seconds=1))
    assert result.leased == 3
    assert [(await get(client, keys, "tenant_b", t))["state"] for t in b] == ["LEASED"] * 3
    assert await used(client, keys, TENANT_A, "tenant_a") == 5000
    assert await used(client, keys, TENANT_B, "tenant_b") == 3000
    # The victims wait for quota, no attempt used: a is over its nominal and can only
    # borrow, and b's nominal is b's.
    for task_id in victims:
        task = await get(client, keys, "tenant_a", task_id)
        assert task["state"] == "ADMITTED"
        assert task["attempts"] == 0
        assert task["pendingReason"]["code"] == "quota_borrow_unavailable"
        evs = (await client.get(f"/v1/tasks/{task_id}/events",
                                headers=keys.tenant_a)).json()["items"]
        reclaimed = [e for e in evs if e["reason"] == "reclaimed"]
        assert len(reclaimed) == 1
        assert reclaimed[0]["detail"]["preemptorId"] in b
    await sound(db)
    metrics = (await client.get("/metrics")).text
    assert 'berth_reclaims_total{outcome="started"}' in metrics
