"""List cursors and event ids reveal no other tenant's volume: they are sealed, the same
length whatever they hold, and open only in the list that gave them."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from tests.api.conftest import assert_problem

SPEC: dict[str, Any] = {
    "runtimeClass": "standard",
    "requests": {"cpuMillis": 100, "memoryMiB": 0, "llmSlots": 0},
}


async def _submit(client: httpx.AsyncClient, headers: dict[str, str]) -> str:
    r = await client.post("/v1/tasks", json=SPEC, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def _page(client: httpx.AsyncClient, url: str, headers: dict[str, str],
                cursor: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": 1}
    if cursor is not None:
        params["cursor"] = cursor
    r = await client.get(url, params=params, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def _carries(token: str, number: int) -> bool:
    """Return whether ``token`` shows ``number`` to anyone who decodes it.

    Its decimal digits are looked for only when there are at least three of them: a random
    byte of a sealed token is an ASCII digit one time in 26, so a one-digit number would be
    "found" in most tokens by chance."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    digits = str(number).encode()
    return ((len(digits) >= 3 and digits in raw) or number.to_bytes(8, "big") in raw
            or number.to_bytes(8, "little") in raw)


async def test_another_tenants_thousand_tasks_leave_my_cursors_and_event_ids_as_they_were(
    client: httpx.AsyncClient, keys
) -> None:
    a = keys.tenant_a
    first = await _submit(client, a)
    await _submit(client, a)
    before = await _page(client, "/v1/tasks", a)
    events_before = await _page(client, f"/v1/tasks/{first}/events", a)

    # Another tenant makes 1,000 tasks (and 1,000 events) in between.
    r = await client.post("/v1/task-batches", json={"items": [{"spec": SPEC}] * 1000},
                          headers=keys.tenant_b)
    assert r.status_code == 200, r.text
    third = await _submit(client, a)

    second_page = await _page(client, "/v1/tasks", a, before["nextCursor"])
    third_page = await _page(client, "/v1/tasks", a, second_page["nextCursor"])
    assert [t["id"] for t in third_page["items"]] == [third]
    events_after = await _page(client, f"/v1/tasks/{third}/events", a)
    (event_before,) = events_before["items"]
    (event_after,) = events_after["items"]

    # Tokens look alike whatever global position they hold: same length, same alphabet...
    tokens = [before["nextCursor"], second_page["nextCursor"], event_before["id"],
              event_after["id"]]
    assert len({len(t) for t in tokens}) == 1, tokens
    assert all(isinstance(t, str) and t.isascii() for t in tokens)
    # ... and none shows the global count (the old cursor of the third task was base64 of
    # 1003, its event id 1003).
    assert not any(_carries(t, n) for t in tokens for n in (1, 2, 1002, 1003))
    # The same position keeps its token: pages and event ids are stable.
    assert (await _page(client, "/v1/tasks", a))["nextCursor"] == before["nextCursor"]
    again = await _page(client, f"/v1/tasks/{first}/events", a)
    assert again["items"][0]["id"] == event_before["id"]


async def test_a_cursor_opens_only_in_the_list_that_gave_it(
    client: httpx.AsyncClient, keys
) -> None:
    a, b = keys.tenant_a, keys.tenant_b
    one, two = await _submit(client, a), await _submit(client, a)
    await _submit(client, b)
    await _submit(client, b)
    mine = (await _page(client, "/v1/tasks", a))["nextCursor"]
    theirs = (await _page(client, "/v1/tasks", b))["nextCursor"]
    assert mine != theirs
    r = await client.get("/v1/tasks", params={"cursor": mine}, headers=b)
    assert "cursor" in assert_problem(r, 400)["detail"]
    event_id = (await _page(client, f"/v1/tasks/{one}/events", a))["items"][0]["id"]
    r = await client.get(f"/v1/tasks/{two}/events", params={"cursor": event_id}, headers=a)
    assert_problem(r, 400)
    r = await client.get("/v1/tasks", params={"cursor": event_id}, headers=a)
    assert_problem(r, 400)
    # An event id is a cursor of its own task's list: what follows it.
    r = await client.get(f"/v1/tasks/{one}/events", params={"cursor": event_id}, headers=a)
    assert r.status_code == 200 and r.json() == {"items": [], "nextCursor": None}
    # Altered by one character: refused.
    flipped = mine[:-1] + ("A" if mine[-1] != "A" else "B")
    r = await client.get("/v1/tasks", params={"cursor": flipped}, headers=a)
    assert_problem(r, 400)


async def test_queue_figures_count_no_task_of_a_tenant_that_shares_no_pool(
    client: httpx.AsyncClient, keys, pool_make, app
) -> None:
    from app.services.queue import QueueCache

    app.state.queue_cache = QueueCache(0.0)  # every getTask reads the queue afresh
    await pool_make("pool-a", tenant_ids=["tenant-a"], runtimeClass="standard")
    await pool_make("pool-b", tenant_ids=["tenant-b"], runtimeClass="standard",
                    runtimeInstanceId="rt-2")
    mine = await _submit(client, keys.tenant_a)

    async def queue() -> dict[str, Any]:
        r = await client.get(f"/v1/tasks/{mine}", headers=keys.tenant_a)
        assert r.status_code == 200, r.text
        return r.json()["queue"]

    alone = await queue()
    assert (alone["position"], alone["competing"]) == (1, 1)
    # tenant-b queues 37 tasks that only its own pool may take: nothing changes for me.
    r = await client.post("/v1/task-batches", json={"items": [{"spec": SPEC}] * 37},
                          headers=keys.tenant_b)
    assert r.status_code == 200, r.text
    assert await queue() == alone
