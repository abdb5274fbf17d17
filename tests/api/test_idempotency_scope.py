"""Idempotency records belong to one API key: a key of the same subject never replays another's
answer, and a replay is authorized like a first request."""

from __future__ import annotations

import httpx

from app.db import Database
from app.ledger.keys import api_key_create
from tests.api.conftest import RUNTIME_1, RUNTIME_2, Keys, PoolMaker, assert_problem
from tests.api.ledger_state import lease_hold

BODY = {"outcome": "succeeded", "epoch": 1}


async def runtime_keys(db: Database) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Return three runtime keys of ONE subject: two for rt-1, one for rt-2."""
    async with db.transaction() as conn:
        made = [
            await api_key_create(conn, role="runtime", subject="fleet",
                                 runtime_instance_ids=[instance])
            for instance in (RUNTIME_1, RUNTIME_1, RUNTIME_2)
        ]
    return tuple({"Authorization": f"Bearer {k}", "Idempotency-Key": "done-1"}  # type: ignore[return-value]
                 for k in made)


async def test_a_key_of_the_same_subject_for_another_instance_gets_404_not_the_replay(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0))
    first, _, other_instance = await runtime_keys(db)
    url = f"/v1/leases/{held.id}/complete"

    done = await client.post(url, json=BODY, headers=first)
    assert done.status_code == 200, done.text
    replay = await client.post(url, json=BODY, headers=first)
    assert replay.status_code == 200 and replay.json() == done.json()
    assert replay.headers["idempotent-replayed"] == "true"

    # Same subject, same Idempotency-Key, same body — but a key for another instance: the
    # answer is the 404 it gets without the header, never the stored 200.
    stolen = await client.post(url, json=BODY, headers=other_instance)
    assert_problem(stolen, 404)
    without_header = {"Authorization": other_instance["Authorization"]}
    assert_problem(await client.post(url, json=BODY, headers=without_header), 404)


async def test_two_keys_of_one_subject_do_not_share_records(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x")
    held = await lease_hold(db, pool_id="pool-x", amounts=(100, 0, 0))
    first, second, _ = await runtime_keys(db)
    url = f"/v1/leases/{held.id}/complete"

    assert (await client.post(url, json=BODY, headers=first)).status_code == 200
    # The second key may complete rt-1's leases, but it has no record under this
    # Idempotency-Key: its request runs for real and finds the lease completed already.
    again = await client.post(url, json=BODY, headers=second)
    assert "idempotent-replayed" not in again.headers
    assert_problem(again, 409)
    async with db.connection() as conn:
        scopes = await conn.fetch("SELECT key_id FROM idempotency_records")
    assert len(scopes) == 1


async def test_a_pool_action_replay_is_authorized_first(
    client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker, db: Database
) -> None:
    await pool_make("pool-x", operators=["ops"])
    async with db.transaction() as conn:
        ops = await api_key_create(conn, role="operator", subject="ops")
    headers = {"Authorization": f"Bearer {ops}", "Idempotency-Key": "c-1"}
    assert (await client.post("/v1/pools/pool-x/cordon", headers=headers)).status_code == 200
    # The pool no longer lists "ops" as an operator (so "ops" no longer sees it): the same
    # key's replay is refused exactly as a first request is.
    patched = await client.patch("/v1/pools/pool-x", json={"operators": ["someone-else"]},
                                 headers=keys.admin)
    assert patched.status_code == 200, patched.text
    replay = await client.post("/v1/pools/pool-x/cordon", headers=headers)
    fresh = await client.post("/v1/pools/pool-x/cordon",
                              headers={**headers, "Idempotency-Key": "c-2"})
    assert_problem(replay, 404)
    assert replay.json() == fresh.json()
