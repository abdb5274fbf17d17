"""``berth bench hostile``: its attackers and its exit status (no timings)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from bench import hostile

UNAUTHORIZED = (b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/problem+json\r\n"
                b"content-length: 2\r\n\r\n{}")


@contextlib.contextmanager
def stub_server(*, close_after_answer: bool) -> Iterator[int]:
    """Serve a 401 to every request head on a free port (keep-alive unless told to close)."""
    ready = threading.Event()
    port: list[int] = []
    loop = asyncio.new_event_loop()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(UNAUTHORIZED)
                await writer.drain()
                if close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    stop: list[asyncio.Event] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        server = await asyncio.start_server(answer, hostile.LOOPBACK, 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        async with server:
            await stop[0].wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield port[0]
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        loop.close()


def test_the_flood_sends_random_keys_over_keep_alive_connections() -> None:
    with stub_server(close_after_answer=False) as port:
        tally = hostile.flood_invalid_keys(port, rate=200.0, seconds=1.0, connections=4)
    assert tally.statuses.keys() == {401}
    assert tally.answered == tally.sent > 0
    assert tally.opened == 4  # kept alive: one connection each
    assert tally.elapsed == 1.0  # the rate is over the sending window


def test_slow_bodies_reopen_every_connection_the_server_closes() -> None:
    with stub_server(close_after_answer=True) as port:
        tally = hostile.slow_bodies(port, connections=5, seconds=1.0)
    assert tally.statuses.keys() == {401}
    assert tally.opened > 5  # each answered connection was opened again
    assert hostile.SLOW_BODY.endswith(b"Content-Length: 100\r\n\r\n{")


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert hostile.main(["--flood-rate", "0"]) == 2
    assert hostile.main(["--slow-connections", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err


def server_stubbed(monkeypatch: pytest.MonkeyPatch, measured: dict[str, Any]) -> None:
    """Replace the database, the server and the attack with stubs answering ``measured``."""
    @contextlib.contextmanager
    def nothing(*args: Any, **kwargs: Any) -> Iterator[Any]:
        yield ("postgresql://nowhere/db", "a fresh database") if not kwargs else 1

    monkeypatch.setattr(hostile, "_fresh_database", nothing)
    monkeypatch.setattr(hostile, "berth_serve", lambda url, port: contextlib.nullcontext(1))
    monkeypatch.setattr(hostile, "_tenant_key", lambda url, tenant: "berth_key")
    monkeypatch.setattr(hostile, "_attack", lambda port, key, args, progress: dict(measured))


@pytest.mark.parametrize("rate, status", [(999.9, 1), (1000.0, 0)])
def test_the_exit_status_says_whether_the_flood_reached_its_rate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], rate: float,
    status: int,
) -> None:
    server_stubbed(monkeypatch, {"alone": {"p50Ms": 1.0}, "flood": {"rate": rate},
                                 "floodP50Ratio": 1.0, "slowBodies": {}})
    assert hostile.main(["--flood-rate", "1000", "--json"]) == status
    out, err = capsys.readouterr()
    assert json.loads(out)["flood"]["rate"] == rate
    assert ("not 1000" in err) == (status == 1)


def test_without_json_it_ends_with_a_table_of_the_headline_figures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def reads(p50: float, ok: float) -> dict[str, Any]:
        return {"count": 100, "p50Ms": p50, "okShare": ok, "statuses": {"200": 100}}

    server_stubbed(monkeypatch, {
        "alone": reads(2.0, 1.0), "floodP50Ratio": 2.5,
        "flood": {"targetRate": 1000.0, "rate": 1052.3, "reads": reads(5.0, 1.0)},
        "slowBodies": {"opened": 612, "reads": reads(6.8, 0.98)}})
    assert hostile.main(["--flood-rate", "1000"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1:] == [
        "  reads alone              p50 2.0 ms, 100.0 % answered 200",
        "  reads under the flood    p50 5.0 ms, 100.0 % answered 200 (2.5x the p50 alone)",
        "  flood of invalid keys    1,052.3 requests/s of 1,000 asked",
        "  reads under slow bodies  p50 6.8 ms, 98.0 % answered 200 (612 slow connections "
        "opened)",
    ]
    assert out.startswith("berth bench hostile: berth serve (no reconciler), same machine;")
    assert "berth bench hostile: starting berth serve on a fresh database ..." in err
