"""A runtime gives a lease back unfinished (`released`): the task is queued again, without
using an attempt when the lease was REVOKING, with one when it was ACTIVE; a revoking
victim's capacity goes at once to the task that preempted it."""

from __future__ import annotations

from app.metrics import LEASES_COMPLETED, PREEMPTION_VICTIMS
from tests.factories import ledger_violations

CAPACITY = {"cpuMillis": 2000, "memoryMiB": 8192, "llmSlots": 0}


def spec(cpu: int = 1000, **fields) -> dict:
    return {"runtimeClass": "gpu-small", "requests": {"cpuMillis": cpu}, **fields}


async def submit(client, keys, body: dict) -> str:
    r = await client.post("/v1/tasks", json=body, headers=keys.tenant_a)
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def task(client, keys, task_id: str) -> dict:
    r = await client.get(f"/v1/tasks/{task_id}", headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    return r.json()


async def leases(client, keys) -> dict[str, dict]:
    r = await client.get("/v1/runtimes/rt-1/leases", headers=keys.runtime_1)
    assert r.status_code == 200, r.text
    return {x["taskId"]: x for x in r.json()["items"]}


async def release(client, keys, lease: dict):
    return await client.post(
        f"/v1/leases/{lease['id']}/complete",
        json={"outcome": "released", "epoch": lease["epoch"], "message": "shutting down"},
        headers=keys.runtime_1,
    )


async def events(client, keys, task_id: str) -> list[dict]:
    r = await client.get(f"/v1/tasks/{task_id}/events", headers=keys.tenant_a)
    assert r.status_code == 200, r.text
    return r.json()["items"]


async def reserved_cpu(client, keys) -> int:
    return (await client.get("/v1/pools/pool-x", headers=keys.admin)).json()["reserved"][
        "cpuMillis"]


async def test_release_of_an_active_lease_requeues_with_an_attempt(
    client, keys, pool_make, reconcile, db
) -> None:
    await pool_make("pool-x", capacity=CAPACITY)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    task_id = await submit(client, keys, spec())
    assert (await reconcile()).leased == 1
    lease = (await leases(client, keys))[task_id]
    before = LEASES_COMPLETED.labels("released")._value.get()

    r = await release(client, keys, lease)

    assert r.status_code == 200, r.text
    assert r.json()["state"] == "ADMITTED" and r.json()["outcome"] == "released"
    got = await task(client, keys, task_id)
    assert got["state"] == "ADMITTED" and got["attempts"] == 1 and got["lease"] is None
    assert await reserved_cpu(client, keys) == 0
    assert task_id not in await leases(client, keys)
    last = (await events(client, keys, task_id))[-1]
    assert (last["reason"], last["fromState"], last["toState"]) == (
        "lease_released", "LEASED", "ADMITTED")
    assert LEASES_COMPLETED.labels("released")._value.get() == before + 1
    # The old epoch is spent: a late report of the same lease is refused.
    assert (await release(client, keys, lease)).status_code == 409
    # Queued again, it is placed again with a newer epoch.
    assert (await reconcile()).leased == 1
    again = (await leases(client, keys))[task_id]
    assert again["epoch"] > lease["epoch"]
    assert await ledger_violations(db) == []


async def test_release_of_an_active_lease_on_the_last_attempt_fails_the_task(
    client, keys, pool_make, reconcile
) -> None:
    await pool_make("pool-x", capacity=CAPACITY)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    task_id = await submit(client, keys, spec(maxAttempts=1))
    assert (await reconcile()).leased == 1
    lease = (await leases(client, keys))[task_id]

    r = await release(client, keys, lease)

    assert r.status_code == 200, r.text
    assert r.json()["state"] == "FAILED"
    got = await task(client, keys, task_id)
    assert got["state"] == "FAILED" and got["attempts"] == 1
    assert await reserved_cpu(client, keys) == 0


async def test_release_of_a_revoking_lease_hands_the_capacity_to_the_preemptor(
    client, keys, pool_make, reconcile, db
) -> None:
    await pool_make("pool-x", capacity=CAPACITY)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    low = [await submit(client, keys, spec(labels={"n": str(i)})) for i in range(2)]
    assert (await reconcile()).leased == 2
    pre = await submit(client, keys, spec(priority=5, preemption="lowerPriority"))
    assert (await reconcile()).preempting == 1
    listed = await leases(client, keys)
    (victim,) = [t for t in low if listed[t]["state"] == "REVOKING"]
    pending = await task(client, keys, pre)
    assert pending["pendingReason"]["code"] == "preempting"
    victims_before = PREEMPTION_VICTIMS.labels("released")._value.get()

    r = await release(client, keys, listed[victim])

    assert r.status_code == 200, r.text
    assert r.json()["state"] == "ADMITTED"
    got = await task(client, keys, victim)
    assert got["state"] == "ADMITTED" and got["attempts"] == 0  # no attempt used
    last = (await events(client, keys, victim))[-1]
    assert last["reason"] == "lease_released" and last["detail"]["preemptorId"] == pre
    assert PREEMPTION_VICTIMS.labels("released")._value.get() == victims_before + 1
    # The capacity went to the preemptor at once: still reserved, as its hold.
    assert await reserved_cpu(client, keys) == 2000
    assert await ledger_violations(db) == []
    result = await reconcile()
    assert (await task(client, keys, pre))["state"] == "LEASED", result
    # The victim waits for capacity; it was never FAILED for having been asked to stop.
    assert (await task(client, keys, victim))["state"] == "ADMITTED"
    assert await ledger_violations(db) == []


async def test_release_with_an_unknown_outcome_is_422(client, keys, pool_make, reconcile):
    await pool_make("pool-x", capacity=CAPACITY)
    await client.post("/v1/runtimes/rt-1/heartbeat", headers=keys.runtime_1)
    task_id = await submit(client, keys, spec())
    assert (await reconcile()).leased == 1
    lease = (await leases(client, keys))[task_id]
    r = await client.post(f"/v1/leases/{lease['id']}/complete",
                          json={"outcome": "stopped", "epoch": lease["epoch"]},
                          headers=keys.runtime_1)
    assert r.status_code == 422
    assert (await task(client, keys, task_id))["state"] == "LEASED"
