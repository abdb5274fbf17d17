"""The per-tenant cap on queued tasks: 429 naming the cap, exact when submissions are
sequential, within the documented tolerance when they race, and a count kept exact by the
triggers through every state change."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.keys import api_key_create
from app.reconciler import Reconciler, ReconcilerConfig
from tests.api.configured import serving
from tests.api.conftest import assert_problem
from tests.factories import heartbeat_add, pool_add

SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 100}}


async def tenant_keys(db: Database) -> tuple[dict[str, str], dict[str, str]]:
    async with db.transaction() as conn:
        a = await api_key_create(conn, role="tenant", subject="a", tenant_ids=["acme"])
        b = await api_key_create(conn, role="tenant", subject="b", tenant_ids=["globex"])
    return {"Authorization": f"Bearer {a}"}, {"Authorization": f"Bearer {b}"}


async def counts(db: Database) -> tuple[dict[str, int], dict[str, int]]:
    """Return (the counter's sums, the real queued counts) per tenant."""
    async with db.connection() as conn:
        counter = await conn.fetch(
            "SELECT tenant_id, sum(queued)::int AS n FROM tenant_queue_counts GROUP BY tenant_id"
        )
        real = await conn.fetch(
            "SELECT tenant_id, count(*)::int AS n FROM tasks "
            "WHERE state IN ('ADMITTED', 'CLAIMED') GROUP BY tenant_id"
        )
    return ({r["tenant_id"]: r["n"] for r in counter if r["n"]},
            {r["tenant_id"]: r["n"] for r in real})


async def test_past_the_cap_a_submission_is_429_naming_the_cap(
    db: Database, database_url: str
) -> None:
    acme, globex = await tenant_keys(db)
    async with serving(database_url, max_queued_tasks_per_tenant=3) as client:
        keyed = {**acme, "Idempotency-Key": "first"}
        made = [await client.post("/v1/tasks", json=SPEC, headers=keyed)]
        made += [await client.post("/v1/tasks", json=SPEC, headers=acme) for _ in range(2)]
        assert [r.status_code for r in made] == [201, 201, 201]

        refused = await client.post("/v1/tasks", json=SPEC, headers=acme)
        problem = assert_problem(refused, 429)
        assert problem["type"].endswith("/tenant-queue-full")
        assert "BERTH_MAX_QUEUED_TASKS_PER_TENANT" in problem["detail"]
        assert "3 queued tasks" in problem["detail"] and problem["maxQueuedTasks"] == 3
        assert int(refused.headers["retry-after"]) > 0

        # A repeat of a stored submission is still its original answer, not a refusal.
        again = await client.post("/v1/tasks", json=SPEC, headers=keyed)
        assert again.status_code == 200 and again.json()["id"] == made[0].json()["id"]
        # Another tenant has its own cap.
        assert (await client.post("/v1/tasks", json=SPEC, headers=globex)).status_code == 201
        # A cancelled task leaves the queue: there is room for one more.
        task_id = made[1].json()["id"]
        cancelled = await client.post(f"/v1/tasks/{task_id}/cancel", headers=acme)
        assert cancelled.status_code == 200, cancelled.text
        assert (await client.post("/v1/tasks", json=SPEC, headers=acme)).status_code == 201
        assert_problem(await client.post("/v1/tasks", json=SPEC, headers=acme), 429)
    counter, real = await counts(db)
    assert counter == real == {"acme": 3, "globex": 1}


async def test_leased_tasks_leave_the_queue(db: Database, database_url: str) -> None:
    acme, _ = await tenant_keys(db)
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["acme"], runtime_class="gpu-small",
                       capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=datetime.now(UTC))
    async with serving(database_url, max_queued_tasks_per_tenant=2) as client:
        for _ in range(2):
            assert (await client.post("/v1/tasks", json=SPEC, headers=acme)).status_code == 201
        assert_problem(await client.post("/v1/tasks", json=SPEC, headers=acme), 429)
        reconciler = Reconciler(db, ReconcilerConfig(), owner_id="cap",
                                slots=frozenset(range(SHARD_SLOTS)))
        try:
            assert (await reconciler.run_once(now=datetime.now(UTC))).leased == 2
        finally:
            await reconciler.close()
        assert (await client.post("/v1/tasks", json=SPEC, headers=acme)).status_code == 201
    counter, real = await counts(db)
    assert counter == real == {"acme": 1}


async def test_zero_turns_the_cap_off(db: Database, database_url: str) -> None:
    acme, _ = await tenant_keys(db)
    async with db.connection() as conn:
        await conn.execute("INSERT INTO tenant_queue_counts VALUES ('acme', 99, 1000000)")
    async with serving(database_url, max_queued_tasks_per_tenant=0) as client:
        assert (await client.post("/v1/tasks", json=SPEC, headers=acme)).status_code == 201
    async with serving(database_url, max_queued_tasks_per_tenant=10) as client:
        assert_problem(await client.post("/v1/tasks", json=SPEC, headers=acme), 429)


POOL_SIZE = 8


@pytest.mark.parametrize("cap", [1, 10])
async def test_concurrent_submissions_exceed_the_cap_by_less_than_the_submissions_in_flight(
    db: Database, database_url: str, cap: int
) -> None:
    acme, globex = await tenant_keys(db)
    async with serving(database_url, max_queued_tasks_per_tenant=cap,
                       db_pool_size=POOL_SIZE) as client:

        async def submit(headers: dict[str, str]) -> httpx.Response:
            return await client.post("/v1/tasks", json=SPEC, headers=headers)

        answers = await asyncio.gather(*(submit(acme if i % 4 else globex) for i in range(80)))
    statuses = [r.status_code for r in answers]
    assert set(statuses) <= {201, 429}, [r.text for r in answers if r.status_code not in
                                         (201, 429)]
    counter, real = await counts(db)
    # Each statement sees the queue as committed when it began: at most the submissions in
    # flight at once (one per database connection) can slip past together.
    for tenant in ("acme", "globex"):
        assert cap <= real[tenant] <= cap + POOL_SIZE - 1, (tenant, real)
    assert statuses.count(201) == sum(real.values())
    assert counter == real, "the counter is exact under concurrency"
