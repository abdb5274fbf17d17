"""``berth bench hostile``: an authenticated client's latency while clients without a valid
key attack the same process.

Starts ``berth serve`` (no reconciler) on a fresh database — on the server of
``--server-url`` (default ``BERTH_DATABASE_URL``, else an embedded PostgreSQL in a temporary
directory), dropped afterwards — creates a tenant key, and measures ``GET /v1/tasks`` of one
keep-alive client with that key, one request after another, in three phases:

1. **alone**: the baseline p50;
2. **invalid-key flood**: ``--flood-processes`` separate processes send ``GET /v1/tasks``
   with a new random key each time, paced to ``--flood-rate`` requests per second in total
   over keep-alive connections (reopened when the server closes one);
3. **slow bodies**: a separate process holds ``--slow-connections`` connections that each
   send the head of ``POST /v1/task-batches`` with ``Content-Length: 100`` and one byte of
   body, and opens a new one whenever the server answers or closes one.

Shows its phases on stderr, then prints a short table of the headline figures; with
``--json``, ONE JSON line: each phase's p50 (ms) and statuses, the flood's achieved rate and
its answers, the share of the client's reads answered 200 under slow bodies, and
``floodP50Ratio``. Exits 1 when the flood did not reach ``--flood-rate`` (the figures would
not show what they claim), else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.api import _free_port, _fresh_database, _read_response, _tenant_key
from bench.database import SERVER_HELP, env_server_url
from bench.report import Progress, json_option, result_print
from bench.workers import REPO_ROOT, python_env

__all__ = ["build_parser", "main", "reads_measure", "slow_bodies", "flood_invalid_keys"]

LOOPBACK = "127.0.0.1"
#: The flood is paced this much above --flood-rate, so that pacing jitter alone does not
#: leave the achieved rate just under it.
FLOOD_MARGIN = 1.05


@dataclass
class Tally:
    """Answers by status, requests sent, connections opened, over ``elapsed`` seconds."""

    statuses: dict[int, int] = field(default_factory=dict)
    sent: int = 0
    opened: int = 0
    elapsed: float = 0.0

    def add(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())


def _request(path: bytes, authorization: bytes | None) -> bytes:
    auth = b"Authorization: " + authorization + b"\r\n" if authorization else b""
    return b"GET " + path + b" HTTP/1.1\r\nHost: berth\r\n" + auth + b"\r\n"


# --- the authenticated client (the bench's own process) ------------------------------------


def reads_measure(port: int, key: str, seconds: float) -> tuple[list[float], dict[int, int]]:
    """Send ``GET /v1/tasks`` with ``key`` one after another for ``seconds``; return the
    latencies (seconds) of the 200s and the count of every status."""

    async def run() -> tuple[list[float], dict[int, int]]:
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        raw = _request(b"/v1/tasks?limit=10", b"Bearer " + key.encode())
        deadline = time.perf_counter() + seconds
        reader = writer = None
        while time.perf_counter() < deadline:
            if writer is None:
                reader, writer = await asyncio.open_connection(LOOPBACK, port)
            assert reader is not None
            start = time.perf_counter()
            try:
                writer.write(raw)
                status, _ = await _read_response(reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                reader = writer = None
                statuses[0] = statuses.get(0, 0) + 1
                continue
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies.append(time.perf_counter() - start)
        if writer is not None:
            writer.close()
        return latencies, statuses

    return asyncio.run(run())


# --- the attackers (separate processes) -------------------------------------------------------


def flood_invalid_keys(port: int, rate: float, seconds: float, connections: int) -> Tally:
    """Send ``GET /v1/tasks`` with a new random key each, paced to ``rate`` per second over
    ``connections`` keep-alive connections, for ``seconds``; return what was answered."""
    tally = Tally()

    async def connection(index: int, start: float) -> None:
        interval = connections / rate
        next_at = start + index * interval / connections
        reader = writer = None
        while True:
            now = time.perf_counter()
            if now - start >= seconds:
                break
            if next_at > now:
                await asyncio.sleep(next_at - now)
            next_at += interval
            if writer is None:
                reader, writer = await asyncio.open_connection(LOOPBACK, port)
                tally.opened += 1
            assert reader is not None
            key = b"Bearer berth_" + secrets.token_urlsafe(32).encode()
            try:
                writer.write(_request(b"/v1/tasks", key))
                tally.sent += 1
                status, _ = await _read_response(reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                reader = writer = None
                continue
            tally.add(status)
        if writer is not None:
            writer.close()

    async def run() -> None:
        start = time.perf_counter()
        await asyncio.gather(*(connection(i, start) for i in range(connections)))
        # Every request was sent within the window: the rate is over the window.
        tally.elapsed = seconds

    asyncio.run(run())
    return tally


#: The head of a task batch that announces 100 bytes of body, and the one byte that follows.
SLOW_BODY = (b"POST /v1/task-batches HTTP/1.1\r\nHost: berth\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{")


def slow_bodies(port: int, connections: int, seconds: float) -> Tally:
    """Hold ``connections`` connections that each send :data:`SLOW_BODY` and wait; reopen
    each one the server answers or closes; return the answers, for ``seconds``."""
    tally = Tally()

    async def holder(deadline: float) -> None:
        while time.perf_counter() < deadline:
            try:
                reader, writer = await asyncio.open_connection(LOOPBACK, port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            tally.opened += 1
            try:
                writer.write(SLOW_BODY)
                tally.sent += 1
                head = await asyncio.wait_for(reader.read(12),
                                              max(0.01, deadline - time.perf_counter()))
                if head.startswith(b"HTTP/1.1 "):
                    tally.add(int(head[9:12]))
            except (TimeoutError, ConnectionError):
                pass
            finally:
                writer.close()

    async def run() -> None:
        start = time.perf_counter()
        await asyncio.gather(*(holder(start + seconds) for _ in range(connections)))
        tally.elapsed = time.perf_counter() - start

    asyncio.run(run())
    return tally


# --- the server ---------------------------------------------------------------------------------


@contextmanager
def berth_serve(database_url: str, port: int, **settings: str) -> Iterator[int]:
    """Run ``berth serve`` (no reconciler) on ``database_url``; yield its pid once ready."""
    env = {**python_env(), "BERTH_DATABASE_URL": database_url,
           "BERTH_RECONCILER_ENABLED": "false", "BERTH_LOG_LEVEL": "warning", **settings}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://{LOOPBACK}:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("berth serve did not become ready")
            time.sleep(0.1)
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the command ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``berth bench hostile``."""
    p = argparse.ArgumentParser(
        prog="berth bench hostile",
        description="Measure an authenticated client's GET /v1/tasks latency against `berth "
        "serve` alone, under a flood of random invalid keys from separate processes, and "
        "under slow-body connections without a key. It runs on a fresh database on the "
        "server of --server-url or BERTH_DATABASE_URL; without either, on an embedded "
        "PostgreSQL started in a temporary directory for the run. Exits 1 if the flood did "
        "not reach --flood-rate.",
    )
    p.add_argument("--server-url", default=env_server_url(), help=SERVER_HELP)
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per phase (10)")
    p.add_argument("--flood-rate", type=float, default=1000.0,
                   help="invalid-key requests per second the flood must reach, in total; it "
                   "is paced 5%% above (1000)")
    p.add_argument("--flood-processes", type=int, default=2,
                   help="separate processes sending the flood (2)")
    p.add_argument("--flood-connections", type=int, default=16,
                   help="keep-alive connections per flood process (16)")
    p.add_argument("--slow-connections", type=int, default=300,
                   help="slow-body connections held at once (300)")
    json_option(p)
    return p


def _p50_ms(latencies: list[float]) -> float | None:
    if not latencies:
        return None
    ordered = sorted(latencies)
    return round(ordered[len(ordered) // 2] * 1000, 3)


def _phase(latencies: list[float], statuses: dict[int, int]) -> dict[str, Any]:
    total = sum(statuses.values())
    return {"count": total, "p50Ms": _p50_ms(latencies),
            "okShare": round(statuses.get(200, 0) / total, 4) if total else 0.0,
            "statuses": {str(k): v for k, v in sorted(statuses.items())}}


def _reads_shown(progress: Progress, name: str, port: int, key: str,
                 seconds: float) -> tuple[list[float], dict[int, int]]:
    """Measure the authenticated reads for ``seconds`` as the phase ``name`` of ``progress``."""
    progress.phase(name, unit="reads")
    latencies, statuses = reads_measure(port, key, seconds)
    progress.end(sum(statuses.values()))
    return latencies, statuses


def _attack(port: int, key: str, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Run the three phases against the server on ``port``; return their figures."""
    warm = args.seconds / 5
    _reads_shown(progress, "warm-up", port, key, warm)  # caches warm, connection pool filled
    alone = _phase(*_reads_shown(progress, "reads alone", port, key, args.seconds))

    per_process = args.flood_rate / args.flood_processes
    with ProcessPoolExecutor(max_workers=args.flood_processes) as pool:
        floods: list[Future[Tally]] = [
            pool.submit(flood_invalid_keys, port, per_process * FLOOD_MARGIN,
                        args.seconds + 2 * warm, args.flood_connections)
            for _ in range(args.flood_processes)
        ]
        progress.phase("starting the flood of invalid keys")
        time.sleep(warm)
        flooded = _phase(*_reads_shown(progress, "reads under the flood", port, key,
                                       args.seconds))
        tallies = [f.result() for f in floods]
    answered = sum(t.answered for t in tallies)
    elapsed = max(t.elapsed for t in tallies)
    statuses: dict[int, int] = {}
    for t in tallies:
        for status, n in t.statuses.items():
            statuses[status] = statuses.get(status, 0) + n
    flood = {"targetRate": args.flood_rate, "rate": round(answered / elapsed, 1),
             "processes": args.flood_processes, "answered": answered,
             "statuses": {str(k): v for k, v in sorted(statuses.items())}}

    with ProcessPoolExecutor(max_workers=1) as pool:
        held = pool.submit(slow_bodies, port, args.slow_connections, args.seconds + 2 * warm)
        progress.phase("opening slow-body connections")
        time.sleep(warm)
        slowed = _phase(*_reads_shown(progress, "reads under slow bodies", port, key,
                                      args.seconds))
        slow = held.result()
    attack = {"connections": args.slow_connections, "opened": slow.opened,
              "statuses": {str(k): v for k, v in sorted(slow.statuses.items())}}

    ratio = (round(flooded["p50Ms"] / alone["p50Ms"], 2)
             if flooded["p50Ms"] and alone["p50Ms"] else None)
    return {"alone": alone, "flood": {**flood, "reads": flooded}, "floodP50Ratio": ratio,
            "slowBodies": {**attack, "reads": slowed}}


def _headline(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Return the figures a person reads first, as (name, value) rows."""
    def reads(phase: dict[str, Any]) -> str:
        return f"p50 {phase['p50Ms']} ms, {100 * phase['okShare']:.1f} % answered 200"

    flood, slow = r["flood"], r["slowBodies"]
    return [
        ("reads alone", reads(r["alone"])),
        ("reads under the flood", reads(flood["reads"])
         + (f" ({r['floodP50Ratio']}x the p50 alone)" if r["floodP50Ratio"] else "")),
        ("flood of invalid keys", f"{flood['rate']:,.1f} requests/s of "
                                  f"{flood['targetRate']:,.0f} asked"),
        ("reads under slow bodies", reads(slow["reads"])
         + f" ({slow['opened']:,} slow connections opened)"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the hostile-client benchmark and print one JSON line; return the exit status."""
    args = build_parser().parse_args(list(argv or []))
    if (args.seconds <= 0 or args.flood_rate <= 0 or args.flood_processes < 1
            or args.flood_connections < 1 or args.slow_connections < 1):
        print("berth bench hostile: --seconds, --flood-rate and the process and connection "
              "counts must be positive", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        progress = stack.enter_context(Progress("berth bench hostile"))
        progress.phase("starting berth serve on a fresh database")
        url, described = stack.enter_context(_fresh_database(args.server_url))
        key = _tenant_key(url, "bench-tenant")
        port = _free_port()
        stack.enter_context(berth_serve(url, port))
        result = _attack(port, key, args, progress)
    result.update({
        "server": "berth serve (no reconciler), same machine", "database": described,
        "cpus": os.cpu_count(), "loadAverage1m": round(os.getloadavg()[0], 2),
        "seconds": args.seconds,
    })
    result_print(result, as_json=args.json, rows=_headline,
                 title=f"berth bench hostile: {result['server']}; {result['cpus']} CPUs, "
                       f"load {result['loadAverage1m']}")
    if result["flood"]["rate"] < args.flood_rate:
        print(f"berth bench hostile: the flood reached {result['flood']['rate']:g} requests "
              f"per second, not {args.flood_rate:g}: add --flood-processes", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
