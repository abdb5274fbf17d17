"""Operator status actions through the HTTP API: cordon, drain, activate; who may; idempotency;
the wakeups they send."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from app.db import Database
from app.ledger.keys import api_key_create
from app.ledger.wakeups import Wakeup
from tests.api.conftest import TENANT_A, TENANT_B, Keys, PoolMaker, assert_problem
from tests.api.ledger_state import lease_end, lease_hold


async def test_operator_cordons_its_pool(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    created = await pool_make("pool-x", operators=["operator-x"])

    response = await client.post(
        "/v1/pools/pool-x/cordon", json={"reason": "kernel upgrade"}, headers=keys.operator_x
    )

    assert response.status_code == 200, response.text
    pool = response.json()
    assert pool["status"] == "CORDONED" and pool["statusReason"] == "kernel upgrade"
    assert pool["version"] == created["version"] + 1
    assert response.headers["etag"] == pool["etag"]
    assert pool["drainDeadline"] is None and pool["drainProgress"] is None


async def test_status_actions_need_no_body(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    for action, status in (("cordon", "CORDONED"), ("drain", "DRAINING"), ("activate", "ACTIVE")):
        response = await client.post(f"/v1/pools/pool-x/{action}", headers=keys.operator_x)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == status
        assert response.json()["statusReason"] is None


async def test_drain_reports_deadline_and_progress_until_activated(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    first = await lease_hold(db, pool_id="pool-x", amounts=(100, 128, 0))
    await lease_hold(db, pool_id="pool-x", amounts=(100, 128, 0))
    deadline = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)

    drained = await client.post(
        "/v1/pools/pool-x/drain",
        json={"reason": "decommission", "deadline": deadline.isoformat()},
        headers=keys.operator_x,
    )
    await lease_end(db, lease=first)
    progress = await client.get("/v1/pools/pool-x", headers=keys.operator_x)
    activated = await client.post(
        "/v1/pools/pool-x/activate", json={"reason": "kept"}, headers=keys.operator_x
    )

    assert drained.status_code == 200, drained.text
    assert drained.json()["status"] == "DRAINING"
    assert datetime.fromisoformat(drained.json()["drainDeadline"]) == deadline
    assert drained.json()["drainProgress"] == {"leasesLeft": 2}
    assert progress.json()["drainProgress"] == {"leasesLeft": 1}
    assert progress.json()["activeLeases"] == 1
    pool = activated.json()
    assert pool["status"] == "ACTIVE" and pool["statusReason"] == "kept"
    assert pool["drainDeadline"] is None and pool["drainProgress"] is None


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"deadline": "2001-01-01T00:00:00Z"}, id="deadline-in-the-past"),
        pytest.param({"deadline": "next tuesday"}, id="deadline-not-rfc3339"),
        pytest.param({"deadline": "2999-01-01T00:00:00"}, id="deadline-without-offset"),
        pytest.param({"reason": ""}, id="empty-reason"),
        pytest.param({"reason": "x" * 513}, id="reason-too-long"),
        pytest.param({"why": "no"}, id="unknown-field"),
    ],
)
async def test_drain_with_a_bad_body_is_422(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, body: dict
) -> None:
    await pool_make("pool-x")
    response = await client.post("/v1/pools/pool-x/drain", json=body, headers=keys.operator_x)
    assert_problem(response, 422)
    after = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert after.json()["status"] == "ACTIVE"


async def test_cordon_does_not_take_a_deadline(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    response = await client.post(
        "/v1/pools/pool-x/cordon",
        json={"deadline": "2999-01-01T00:00:00Z"},
        headers=keys.operator_x,
    )
    assert_problem(response, 422)


async def test_tenant_cannot_cordon_a_pool_it_uses(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", tenant_ids=[TENANT_A])

    visible = await client.post("/v1/pools/pool-x/cordon", headers=keys.tenant_a)
    invisible = await client.post("/v1/pools/pool-x/cordon", headers=keys.tenant_b)

    assert_problem(visible, 403)
    assert_problem(invisible, 404)
    after = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert after.json()["status"] == "ACTIVE"


async def test_operator_of_pool_x_cannot_drain_pool_y(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x", operators=["operator-x"])
    await pool_make("pool-y", tenant_ids=[TENANT_B], operators=["operator-y"])
    async with db.transaction() as conn:
        # Operates pool-x and acts for tenant-b, so it can see pool-y but not operate it.
        seeing = await api_key_create(
            conn, role="operator", subject="operator-x", tenant_ids=[TENANT_B]
        )

    unseen = await client.post("/v1/pools/pool-y/drain", headers=keys.operator_x)
    seen = await client.post(
        "/v1/pools/pool-y/drain", headers={"Authorization": f"Bearer {seeing}"}
    )
    own = await client.post("/v1/pools/pool-x/drain", headers=keys.operator_x)

    assert_problem(unseen, 404)
    assert_problem(seen, 403)
    assert own.status_code == 200
    after = await client.get("/v1/pools/pool-y", headers=keys.admin)
    assert after.json()["status"] == "ACTIVE"


async def test_runtime_cannot_operate_its_own_pool(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", runtimeInstanceId="rt-1")
    assert_problem(await client.post("/v1/pools/pool-x/cordon", headers=keys.runtime_1), 403)


async def test_admin_may_operate_any_pool(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x", operators=[])
    response = await client.post("/v1/pools/pool-x/cordon", headers=keys.admin)
    assert response.status_code == 200
    assert response.json()["status"] == "CORDONED"


async def test_status_action_on_unknown_pool_or_without_a_key(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    assert_problem(await client.post("/v1/pools/pool-nope/cordon", headers=keys.admin), 404)
    no_key = await client.post("/v1/pools/pool-x/cordon")
    assert_problem(no_key, 401)
    assert no_key.headers["www-authenticate"] == "Bearer"


async def test_idempotent_cordon_replays_the_first_answer(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    headers = {**keys.operator_x, "Idempotency-Key": "cordon-1"}

    first = await client.post("/v1/pools/pool-x/cordon", json={"reason": "r"}, headers=headers)
    await client.post("/v1/pools/pool-x/activate", headers=keys.operator_x)
    again = await client.post("/v1/pools/pool-x/cordon", json={"reason": "r"}, headers=headers)
    other = await client.post("/v1/pools/pool-x/cordon", json={"reason": "s"}, headers=headers)

    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["etag"] == first.headers["etag"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "cordon-1" in assert_problem(other, 409)["detail"]
    current = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert current.json()["status"] == "ACTIVE", "a replay has no second effect"


async def test_idempotency_keys_are_per_subject_and_operation(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-x")
    key = {"Idempotency-Key": "same-key"}

    cordon = await client.post("/v1/pools/pool-x/cordon", headers={**keys.operator_x, **key})
    drain = await client.post("/v1/pools/pool-x/drain", headers={**keys.operator_x, **key})
    admin = await client.post("/v1/pools/pool-x/activate", headers={**keys.admin, **key})

    assert [r.status_code for r in (cordon, drain, admin)] == [200, 200, 200]
    assert [r.json()["status"] for r in (cordon, drain, admin)] == [
        "CORDONED",
        "DRAINING",
        "ACTIVE",
    ]


async def test_concurrent_duplicate_cordons_act_once(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    created = await pool_make("pool-x")
    headers = {**keys.operator_x, "Idempotency-Key": "race"}

    answers = await asyncio.gather(
        *(
            client.post("/v1/pools/pool-x/cordon", json={"reason": "race"}, headers=headers)
            for _ in range(8)
        )
    )

    assert [r.status_code for r in answers] == [200] * 8
    assert all(r.json() == answers[0].json() for r in answers)
    current = await client.get("/v1/pools/pool-x", headers=keys.admin)
    assert current.json()["version"] == created["version"] + 1


# --- wakeups -----------------------------------------------------------------------------


async def next_wakeup(queue: asyncio.Queue[str]) -> str:
    """Return the next notified wakeup source (failing after a generous wait); the pools it
    names must be the test's one pool."""
    wakeup = Wakeup.parse(await asyncio.wait_for(queue.get(), timeout=10))
    assert wakeup.pools == ("pool-x",)
    return wakeup.source.value


async def test_pool_changes_wake_reconcilers_when_they_could_help(
    client: httpx.AsyncClient,
    keys: Keys,
    pool_make: PoolMaker,
    wakeups: asyncio.Queue[str],
) -> None:
    await pool_make("pool-x", capacity={"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1})
    assert await next_wakeup(wakeups) == "pool_added"
    assert await next_wakeup(wakeups) == "ledger_raised"

    async def put(cpu: int) -> None:
        totals = {"cpuMillis": cpu, "memoryMiB": 1024, "llmSlots": 1}
        response = await client.put("/v1/pools/pool-x/capacity", json=totals, headers=keys.admin)
        assert response.status_code == 200

    await put(500)  # lowering cannot help a pending task: no wakeup
    await client.post("/v1/pools/pool-x/cordon", headers=keys.operator_x)  # nor can a cordon
    await client.post("/v1/pools/pool-x/activate", headers=keys.operator_x)
    await put(2000)

    # Notifications arrive in commit order, so a wakeup from the lowering or the cordon
    # would come before these two.
    assert await next_wakeup(wakeups) == "pool_activated"
    assert await next_wakeup(wakeups) == "ledger_raised"
    assert wakeups.empty()
