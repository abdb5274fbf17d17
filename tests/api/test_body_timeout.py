"""The request body deadline: a body that stops short is 408 problem+json, in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from prometheus_client import REGISTRY

from app.api.timeouts import BodyReadTimeout
from tests.api.configured import serving
from tests.api.conftest import BASE_URL, Keys, assert_problem

ANSWER_WITHIN_SECONDS = 15  # generous: the deadline is 0.5 s


async def stops_short(sent: asyncio.Event) -> AsyncIterator[bytes]:
    """Send the start of a task spec, then nothing more, ever."""
    yield b'{"runtimeClass": "gpu-small", '
    sent.set()
    await asyncio.Event().wait()
    yield b"}"  # never reached


def body_timeouts() -> float:
    """Return how many bodies this process has given up on."""
    return REGISTRY.get_sample_value(
        "berth_http_requests_shed_total", {"reason": "body_timeout"}
    ) or 0.0


async def test_a_body_that_stops_short_is_answered_408_and_the_connection_closed(
    database_url: str, keys: Keys
) -> None:
    before = body_timeouts()
    async with serving(database_url, request_body_timeout_seconds=0.5) as client:
        answers = []
        for path, key in [("/v1/tasks", keys.tenant_a), ("/v1/pools", keys.admin)]:
            sent = asyncio.Event()
            answers.append(await asyncio.wait_for(
                client.post(path, content=stops_short(sent),
                            headers={**key, "Content-Type": "application/json"}),
                ANSWER_WITHIN_SECONDS,
            ))
            assert sent.is_set()
        in_time = await client.post(
            "/v1/tasks", headers=keys.tenant_a,
            json={"runtimeClass": "gpu-small", "requests": {"cpuMillis": 1, "memoryMiB": 1}},
        )

    for answer in answers:
        problem = assert_problem(answer, 408)
        assert problem["type"].endswith("/request-timeout")
        assert "BERTH_REQUEST_BODY_TIMEOUT_SECONDS" in problem["detail"]
        assert answer.headers["connection"] == "close"
    assert in_time.status_code == 201, in_time.text
    assert body_timeouts() == before + 2


async def test_the_deadline_ends_with_the_body_not_with_the_answer() -> None:
    """Work after a complete body, and waiting on receive() for a disconnect, is not cut."""

    async def slow_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await asyncio.sleep(0.3)  # well past the 0.1 s deadline
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    app = BodyReadTimeout(slow_app, timeout_seconds=0.1)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        answer = await client.post("/echo", content=b"all of it")

    assert answer.status_code == 200
    assert answer.content == b"all of it"


async def test_a_body_arriving_in_pieces_after_waits_reaches_the_app_whole() -> None:
    """A receive() that has to wait is awaited to its end under the deadline (the one that
    does not wait is answered at once): every piece arrives, in order."""
    pieces = [b'{"runtimeClass":', b' "gpu-small"', b"}"]
    waits = []

    async def receive():  # type: ignore[no-untyped-def]
        waits.append(len(pieces))
        await asyncio.sleep(0.01)  # the piece is not there yet
        body = pieces.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pieces)}

    async def echo(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    sent: list[dict] = []

    async def send(message) -> None:  # type: ignore[no-untyped-def]
        sent.append(message)

    scope = {"type": "http", "headers": [(b"content-length", b"32")]}
    await BodyReadTimeout(echo, timeout_seconds=5)(scope, receive, send)

    assert waits == [3, 2, 1]
    assert sent[0]["status"] == 200
    assert sent[1]["body"] == b'{"runtimeClass": "gpu-small"}'
