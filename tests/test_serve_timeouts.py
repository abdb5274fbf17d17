"""`berth serve` over real sockets: half-sent requests are answered and closed, not held."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from app.db import Database
from app.ledger.keys import api_key_create
from tests.test_serve import Serve

pytestmark = pytest.mark.slow

HEAD_TIMEOUT_SECONDS = 1
BODY_TIMEOUT_SECONDS = 1
WITHIN_SECONDS = 20  # generous: each deadline is 1 s


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Iterator[Serve]:
    """Yield a `berth serve` on the test database with 1-second read deadlines."""
    workdir = tmp_path_factory.mktemp("serve-timeouts")
    server = Serve(
        workdir,
        workdir / "unused-data-dir",
        BERTH_DATABASE_URL=database_url,
        BERTH_RECONCILER_ENABLED="false",
        BERTH_REQUEST_HEADER_TIMEOUT_SECONDS=str(HEAD_TIMEOUT_SECONDS),
        BERTH_REQUEST_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT_SECONDS),
    )
    try:
        server.wait_ready()
        yield server
        assert server.stop(signal.SIGTERM) == 0, server.err.read_text()
    finally:
        server.kill()


def connect(port: int) -> socket.socket:
    """Return a TCP connection to the server."""
    return socket.create_connection(("127.0.0.1", port), timeout=WITHIN_SECONDS)


def read_to_close(sock: socket.socket) -> bytes:
    """Return everything the server sends until it closes; fail if it keeps the connection."""
    deadline = time.monotonic() + WITHIN_SECONDS
    received = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"still open after {WITHIN_SECONDS} s: {received!r}") from None
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def problem_of(answer: bytes, status: int) -> dict:
    """Assert ``answer`` is a raw HTTP/1.1 problem+json with ``status``; return its body."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), answer
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers["content-type"].startswith("application/problem+json"), headers
    assert headers.get("connection") == "close", headers
    problem = json.loads(body)
    assert problem["status"] == status and problem["detail"], problem
    return problem


def open_files(pid: int) -> int:
    return psutil.Process(pid).num_fds()


def wait_for(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WITHIN_SECONDS
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_half_sent_heads_and_silent_connections_are_answered_408_and_closed(
    serve: Serve,
) -> None:
    baseline = open_files(serve.proc.pid)
    half = [connect(serve.port) for _ in range(40)]
    silent = [connect(serve.port) for _ in range(40)]
    try:
        for sock in half:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: berth\r\nX-Slow: ")
        wait_for(lambda: open_files(serve.proc.pid) >= baseline + 70,
                 "the server never accepted the connections")
        # Meanwhile a whole request is served as usual.
        healthy = httpx.get(f"http://127.0.0.1:{serve.port}/healthz", timeout=WITHIN_SECONDS)

        answers = [read_to_close(sock) for sock in half + silent]
    finally:
        for sock in half + silent:
            sock.close()

    assert healthy.status_code == 200
    for answer in answers:
        problem = problem_of(answer, 408)
        assert "BERTH_REQUEST_HEADER_TIMEOUT_SECONDS" in problem["detail"]
    wait_for(lambda: open_files(serve.proc.pid) <= baseline + 2,
             "the server still holds the connections' files")


def test_a_head_past_64_kib_is_answered_431_and_closed(serve: Serve) -> None:
    with connect(serve.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: berth\r\nX-Big: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(20):  # 80 KiB of one header value, never finished
                sock.sendall(b"a" * 4096)
        answer = read_to_close(sock)

    assert "larger than 65536 bytes" in problem_of(answer, 431)["detail"]


def key_create(database_url: str) -> str:
    """Return a new tenant key (tenant-a) stored in the test database."""

    async def create() -> str:
        db = Database(database_url, max_size=1)
        try:
            async with db.transaction() as conn:
                return await api_key_create(conn, role="tenant", subject="hostile-test",
                                            tenant_ids=["tenant-a"])
        finally:
            await db.close()

    return asyncio.run(create())


def test_a_head_past_64_kib_in_one_packet_is_answered_431_before_the_app(serve: Serve) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: berth\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    with connect(serve.port) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)
        answer = read_to_close(sock)

    assert "larger than 65536 bytes" in problem_of(answer, 431)["detail"]


def test_a_large_head_after_a_first_request_on_a_kept_alive_connection_is_431(
    serve: Serve,
) -> None:
    first = b"GET /healthz HTTP/1.1\r\nHost: berth\r\n\r\n"
    big = (b"GET /healthz HTTP/1.1\r\nHost: berth\r\n"
           + b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 1000) for i in range(130)) + b"\r\n")
    with connect(serve.port) as sock:
        sock.sendall(first)
        received = b""
        while b'"ok"' not in received:
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200 "), received
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(big)
        answer = read_to_close(sock)

    assert "larger than 65536 bytes" in problem_of(answer, 431)["detail"]


def test_a_body_that_announces_100_bytes_and_sends_10_is_answered_408_and_closed(
    serve: Serve, database_url: str
) -> None:
    key = key_create(database_url)
    with connect(serve.port) as sock:
        sock.sendall(
            b"POST /v1/tasks HTTP/1.1\r\nHost: berth\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 100\r\n\r\n"
            b'{"runtime'
        )
        answer = read_to_close(sock)

    problem = problem_of(answer, 408)
    assert problem["type"].endswith("/request-timeout")
    assert "BERTH_REQUEST_BODY_TIMEOUT_SECONDS" in problem["detail"]


def test_a_body_without_a_valid_key_is_answered_401_at_once_and_left_unread(
    serve: Serve,
) -> None:
    with connect(serve.port) as sock:
        sock.sendall(
            b"POST /v1/tasks HTTP/1.1\r\nHost: berth\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer berth_not_a_key\r\nContent-Length: 100\r\n\r\n"
            b'{"runtime'
        )
        answer = read_to_close(sock)

    assert problem_of(answer, 401)["type"].endswith("/unauthorized")


def test_keep_alive_requests_in_time_are_served_on_one_connection(serve: Serve) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{serve.port}") as client:
        first = client.get("/healthz")
        time.sleep(HEAD_TIMEOUT_SECONDS / 2)
        second = client.get("/healthz")
        third = client.get("/v1/pools", headers={"Authorization": "Bearer nope"})

    assert (first.status_code, second.status_code) == (200, 200)
    assert third.status_code == 401, third.text
