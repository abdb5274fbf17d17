"""The watch feed as Server-Sent Events on a real server: resume after a disconnect and after
a restart, heartbeats and bookmarks, the watch limits, and the end of a stream when the
database goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson

from app.db import Database
from tests.api.conftest import Keys, assert_problem
from tests.api.live import live_server

SPEC = {"runtimeClass": "gpu-small",
        "requests": {"cpuMillis": 500, "memoryMiB": 256, "llmSlots": 1}}
SSE = {"Accept": "text/event-stream"}


class Stream:
    """The records of one open SSE answer, read as they come."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()

    async def record(self, seconds: float = 10) -> dict[str, Any]:
        """Return the next record: ``event``, ``id``, ``data`` (parsed), or ``comment``."""
        record: dict[str, Any] = {}
        async with asyncio.timeout(seconds):
            async for line in self.lines:
                if not line:
                    if record:
                        return record
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "":
                    record["comment"] = value
                elif name == "data":
                    record["data"] = orjson.loads(value)
                else:
                    record[name] = value
        return record

    async def events(self, count: int, seconds: float = 10) -> list[dict[str, Any]]:
        """Return the next ``count`` event records (skipping heartbeats and bookmarks)."""
        found: list[dict[str, Any]] = []
        while len(found) < count:
            record = await self.record(seconds)
            if record.get("event") not in (None, "bookmark") and "retry" not in record:
                found.append(record)
        return found


@asynccontextmanager
async def stream(http: httpx.AsyncClient, key: dict[str, str], **params: Any
                 ) -> AsyncIterator[Stream]:
    """Open a watch stream and yield it."""
    headers = {**SSE, **key}
    if "last_event_id" in params:
        headers["Last-Event-ID"] = params.pop("last_event_id")
    async with http.stream("GET", "/v1/watch", params=params, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Stream(response)


async def submit(http: httpx.AsyncClient, key: dict[str, str]) -> str:
    """Submit a task and return its id."""
    made = await http.post("/v1/tasks", json=SPEC, headers=key)
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def now_cursor(http: httpx.AsyncClient, key: dict[str, str]) -> str:
    page = await http.get("/v1/watch", params={"after": "now", "wait": 0}, headers=key)
    assert page.status_code == 200, page.text
    return str(page.json()["cursor"])


async def test_a_stream_resumes_after_a_disconnect_from_the_last_event_id(
    live: httpx.AsyncClient, keys: Keys
) -> None:
    start = await now_cursor(live, keys.tenant_a)
    async with stream(live, keys.tenant_a, after=start) as s:
        first = [await submit(live, keys.tenant_a) for _ in range(2)]
        got = await s.events(2)
    assert [r["data"]["taskId"] for r in got] == first
    assert [r["event"] for r in got] == ["task.admitted"] * 2
    assert got[-1]["id"] == got[-1]["data"]["cursor"]

    later = [await submit(live, keys.tenant_a) for _ in range(3)]
    async with stream(live, keys.tenant_a, after=start, last_event_id=got[-1]["id"]) as s:
        again = await s.events(3)
    assert [r["data"]["taskId"] for r in again] == later


async def test_a_stream_resumes_on_a_restarted_server(
    app: Any, keys: Keys, database_url: str
) -> None:
    with live_server(database_url) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            start = await now_cursor(http, keys.tenant_a)
            async with stream(http, keys.tenant_a, after=start) as s:
                before = await submit(http, keys.tenant_a)
                (seen,) = await s.events(1)
            assert seen["data"]["taskId"] == before
            missed = await submit(http, keys.tenant_a)
    with live_server(database_url) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            async with stream(http, keys.tenant_a, last_event_id=seen["id"]) as s:
                (resumed,) = await s.events(1)
    assert resumed["data"]["taskId"] == missed


async def test_an_idle_stream_sends_heartbeats_and_bookmarks_past_invisible_events(
    app: Any, keys: Keys, database_url: str
) -> None:
    with live_server(database_url, watch_heartbeat_seconds=0.3) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            start = await now_cursor(http, keys.tenant_a)
            async with stream(http, keys.tenant_a, after=start) as s:
                assert "retry" in await s.record()
                assert (await s.record(5)).get("comment") == "heartbeat"
                await submit(http, keys.tenant_b)
                record = await s.record(5)
                while record.get("event") != "bookmark":
                    assert record.get("comment") == "heartbeat", record
                    record = await s.record(5)
            assert record["data"]["cursor"] == record["id"] != start
            page = await http.get("/v1/watch", params={"after": record["id"], "wait": 0},
                                  headers=keys.tenant_a)
            assert page.json()["items"] == []


async def test_watches_have_their_own_limits_outside_the_request_slots(
    app: Any, keys: Keys, database_url: str
) -> None:
    with live_server(database_url, max_in_flight_requests=1, watch_max_watchers=3,
                     watch_max_watchers_per_key=2) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            async with stream(http, keys.tenant_a), stream(http, keys.tenant_a):
                third = await http.get("/v1/watch", headers={**SSE, **keys.tenant_a})
                body = assert_problem(third, 429)
                assert body["type"].endswith("watch-limit") and third.headers["retry-after"]
                async with stream(http, keys.tenant_b):
                    fourth = await http.get("/v1/watch", headers={**SSE, **keys.runtime_1})
                    assert_problem(fourth, 429)
                    # Three open watches, and the one request slot is still free.
                    listed = await http.get("/v1/tasks", headers=keys.tenant_a)
                    assert listed.status_code == 200, listed.text
            # Closed streams give their places back (once the server saw them go).
            for _ in range(50):
                again = await http.get("/v1/watch", params={"wait": 0}, headers=keys.tenant_a)
                if again.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert again.status_code == 200, again.text


async def test_a_stream_ends_resumably_when_the_database_goes_away(
    live: httpx.AsyncClient, keys: Keys, db: Database
) -> None:
    start = await now_cursor(live, keys.tenant_a)
    async with stream(live, keys.tenant_a, after=start) as s:
        first = await submit(live, keys.tenant_a)
        (seen,) = await s.events(1)
        async with db.connection() as conn:
            ended = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'berth-watch' AND datname = current_database()")
        assert ended >= 1
        record = await s.record()
        while record.get("event") != "reconnect":
            assert record.get("event") in (None, "bookmark"), record
            record = await s.record()
    assert seen["data"]["taskId"] == first
    assert record["data"]["reason"] == "database-unavailable"
    missed = await submit(live, keys.tenant_a)
    for _ in range(100):
        async with stream(live, keys.tenant_a, last_event_id=record["id"]) as s:
            got = await s.record()
            while "retry" in got or got.get("comment"):
                got = await s.record()
        if got.get("event") != "reconnect":
            break
        await asyncio.sleep(0.1)
    assert got["event"] == "task.admitted" and got["data"]["taskId"] == missed
