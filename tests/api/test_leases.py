"""Lease completion through the HTTP API: outcomes, fencing epochs, ownership, idempotency."""

from __future__ import annotations

import uuid

import httpx
import pytest

from app.db import Database
from tests.api.conftest import RUNTIME_1, Keys, PoolMaker, assert_problem
from tests.api.ledger_state import lease_hold


async def task_state(db: Database, task_id: uuid.UUID) -> str:
    """Return the stored state of ``task_id``."""
    async with db.connection() as conn:
        return await conn.fetchval("SELECT state FROM tasks WHERE id = $1", task_id)


@pytest.mark.parametrize(("outcome", "state"), [("succeeded", "SUCCEEDED"), ("failed", "FAILED")])
async def test_complete_lease_finishes_the_task_and_releases_capacity(
    client: httpx.AsyncClient,
    keys: Keys,
    pool_make: PoolMaker,
    db: Database,
    outcome: str,
    state: str,
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(800, 1024, 1), epoch=3)

    response = await client.post(
        f"/v1/leases/{held.id}/complete",
        json={"outcome": outcome, "epoch": 3, "message": "exit 0"},
        headers=keys.runtime_1,
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["taskId"] == str(held.task_id) and body["leaseId"] == str(held.id)
    assert body["state"] == state and body["outcome"] == outcome and body["epoch"] == 3
    assert body["finishedAt"]
    assert await task_state(db, held.task_id) == state
    pool = (await client.get("/v1/pools/pool-x", headers=keys.admin)).json()
    assert pool["reserved"] == {"cpuMillis": 0, "memoryMiB": 0, "llmSlots": 0}
    assert pool["activeLeases"] == 0
    listed = await client.get(f"/v1/runtimes/{RUNTIME_1}/leases", headers=keys.runtime_1)
    assert listed.json()["items"] == []


async def test_complete_with_a_stale_epoch_is_409_and_changes_nothing(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0), epoch=2)

    response = await client.post(
        f"/v1/leases/{held.id}/complete",
        json={"outcome": "succeeded", "epoch": 1},
        headers=keys.runtime_1,
    )

    assert "stale epoch" in assert_problem(response, 409)["detail"]
    assert await task_state(db, held.task_id) == "LEASED"
    pool = (await client.get("/v1/pools/pool-x", headers=keys.admin)).json()
    assert pool["reserved"]["cpuMillis"] == 100


async def test_completing_twice_is_409(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0))
    body = {"outcome": "succeeded", "epoch": 1}

    first = await client.post(f"/v1/leases/{held.id}/complete", json=body, headers=keys.runtime_1)
    again = await client.post(f"/v1/leases/{held.id}/complete", json=body, headers=keys.runtime_1)

    assert first.status_code == 200
    assert_problem(again, 409)


async def test_idempotent_completion_replays_the_first_answer(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0))
    headers = {**keys.runtime_1, "Idempotency-Key": f"complete-{held.id}"}
    body = {"outcome": "succeeded", "epoch": 1}

    first = await client.post(f"/v1/leases/{held.id}/complete", json=body, headers=headers)
    again = await client.post(f"/v1/leases/{held.id}/complete", json=body, headers=headers)
    changed = await client.post(
        f"/v1/leases/{held.id}/complete", json={**body, "outcome": "failed"}, headers=headers
    )

    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert_problem(changed, 409)
    assert await task_state(db, held.task_id) == "SUCCEEDED"


async def test_unknown_lease_and_another_instance_lease_are_404(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x", runtimeInstanceId=RUNTIME_1)
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0))
    body = {"outcome": "succeeded", "epoch": 1}

    unknown = await client.post(
        f"/v1/leases/{uuid.uuid4()}/complete", json=body, headers=keys.runtime_1
    )
    foreign = await client.post(
        f"/v1/leases/{held.id}/complete", json=body, headers=keys.runtime_2
    )

    assert_problem(unknown, 404)
    assert_problem(foreign, 404)
    assert await task_state(db, held.task_id) == "LEASED"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"outcome": "done", "epoch": 1}, id="unknown-outcome"),
        pytest.param({"outcome": "succeeded"}, id="missing-epoch"),
        pytest.param({"outcome": "succeeded", "epoch": 0}, id="epoch-zero"),
        pytest.param({"outcome": "succeeded", "epoch": "one"}, id="epoch-not-an-int"),
        pytest.param({"outcome": "succeeded", "epoch": 1, "exitCode": 0}, id="unknown-field"),
        pytest.param({"outcome": "succeeded", "epoch": 1, "message": "x" * 1001}, id="long"),
    ],
)
async def test_complete_with_a_bad_body_is_422(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database, body: dict
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0))
    url = f"/v1/leases/{held.id}/complete"
    response = await client.post(url, json=body, headers=keys.runtime_1)
    assert_problem(response, 422)
    assert await task_state(db, held.task_id) == "LEASED"


async def test_complete_with_a_malformed_lease_id_is_404(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    """No lease can have a malformed id: the path names nothing, as for a task."""
    response = await client.post(
        "/v1/leases/not-a-uuid/complete",
        json={"outcome": "succeeded", "epoch": 1},
        headers=keys.runtime_1,
    )
    assert_problem(response, 404)


@pytest.mark.parametrize("role", ["admin", "tenant_a", "operator_x"])
async def test_only_runtime_keys_complete_leases(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database, role: str
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0))
    response = await client.post(
        f"/v1/leases/{held.id}/complete",
        json={"outcome": "succeeded", "epoch": 1},
        headers=keys[role],
    )
    assert_problem(response, 403)
