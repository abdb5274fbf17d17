"""``berth bench watch``: the watch feed with many idle watchers while tasks are placed.

One run, on a fresh database (``--server-url``, else ``BERTH_DATABASE_URL``, else an embedded
PostgreSQL started for the run):

1. start uvicorn serving Berth (no in-process reconciler) with ``--workers`` worker
   processes (1 by default; production runs several, as many as cores) and one ``berth
   reconcile`` process; create P pools (one runtime instance each, capacity for every task)
   through the API, and keep their runtimes heartbeating;
2. open N idle watchers (``--idle``, 1,000: Server-Sent Events of a tenant that submits
   nothing) and measure the server's resident memory before and after: ``memoryPerWatcherKiB``;
3. open M runtime watchers (one SSE stream per pool's runtime key, ``types=lease``);
4. submit tasks at a fixed rate (``--rate`` per second for ``--seconds``); each runtime
   watcher notes when it sees each ``lease.granted``;
5. print ONE JSON line: submit → ``lease.granted`` seen by the runtime (``p50Ms``, ``p99Ms``,
   from the moment the submission was sent), ``eventsPerSec`` delivered to the watchers,
   ``serverCpuMsPerEvent`` (the API processes' CPU during the submissions, per delivered
   event; they also serve the submissions, so this is an upper bound), ``cpuMsPerSubmission``
   (the CPU of each process of the run per accepted submission: the API, the reconciler,
   PostgreSQL serving the run's database, and this process's clients), the memory per idle
   watcher, and ``apiWorkers``.

The clients (submitter and watchers) run in this process with a minimal HTTP/1.1 client; on
a small machine they share the cores with the server, PostgreSQL and the reconciler.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
import psutil

from bench.api import _free_port, _fresh_database, _uvicorn
from bench.database import SERVER_HELP, database_name, env_server_url
from bench.workers import REPO_ROOT, postgres_cpu_seconds, python_env

__all__ = ["build_parser", "main"]

CAPACITY = {"cpuMillis": 10_000_000, "memoryMiB": 10_000_000, "llmSlots": 0}
SPEC = {"runtimeClass": "python-3.11", "requests": {"cpuMillis": 10, "memoryMiB": 1}}


def _key(url: str, role: str, subject: str, *flags: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "create", "--role", role,
         "--subject", subject, *flags],
        cwd=REPO_ROOT, env={**python_env(), "BERTH_DATABASE_URL": url},
        capture_output=True, text=True, check=True,
    )
    return done.stdout.strip().splitlines()[-1]


async def _request(host: str, port: int, method: str, path: str, key: str,
                   body: Any = None) -> tuple[int, Any]:
    """Send one request on a new connection; return (status, parsed JSON body)."""
    reader, writer = await asyncio.open_connection(host, port)
    data = orjson.dumps(body) if body is not None else b""
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n".encode() + data)
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, orjson.loads(payload) if payload.strip() else None


class Submitter:
    """Keep-alive connections sending ``POST /v1/tasks``, noting when each was sent."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self.host, self.port, self.key = host, port, key
        self.sent: dict[str, float] = {}
        self.errors = 0
        self._body = orjson.dumps(SPEC)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def submit(self) -> None:
        """Submit one task."""
        conn = self._idle.pop() if self._idle else await asyncio.open_connection(
            self.host, self.port)
        reader, writer = conn
        started = time.perf_counter()
        writer.write(
            f"POST /v1/tasks HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer "
            f"{self.key}\r\nContent-Type: application/json\r\nContent-Length: "
            f"{len(self._body)}\r\n\r\n".encode() + self._body)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            body = await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            # The server closed the connection (a refusal closes it): counted, not reused.
            self.errors += 1
            writer.close()
            return
        if head.split(b" ", 2)[1] != b"201":
            self.errors += 1
        else:
            self.sent[orjson.loads(body)["id"]] = started
        self._idle.append(conn)


async def _stream(host: str, port: int, key: str, query: str,
                  seen: dict[str, float] | None, counter: list[int],
                  ready: asyncio.Event | None = None,
                  progress: asyncio.Event | None = None) -> None:
    """Hold one SSE watch open, resuming from the last id when the server ends it; note
    when each lease.granted arrives (by task id)."""
    resume = ""
    while True:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /v1/watch?{query} HTTP/1.1\r\nHost: {host}\r\nAuthorization: "
                     f"Bearer {key}\r\nAccept: text/event-stream\r\n{resume}\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            writer.close()
            await asyncio.sleep(1)
            continue
        if ready is not None:
            ready.set()
        event = b""
        try:
            while line := await reader.readline():
                if line.startswith(b"id: "):
                    resume = f"Last-Event-ID: {line[4:].strip().decode()}\r\n"
                elif line.startswith(b"event: "):
                    event = line[7:].strip()
                elif line.startswith(b"data: ") and event.startswith((b"task.", b"lease.")):
                    counter[0] += 1
                    if seen is not None and event == b"lease.granted":
                        seen[orjson.loads(line[6:])["taskId"]] = time.perf_counter()
                        if progress is not None:
                            progress.set()
        finally:
            writer.close()


def _processes(pid: int) -> list[psutil.Process]:
    """Return the server's processes: uvicorn's main process and its workers."""
    main = psutil.Process(pid)
    return [main, *main.children(recursive=True)]


def _rss(pid: int, workers: int) -> int:
    """Return the resident memory of the processes that hold the watchers: uvicorn's main
    process when it serves alone, else its worker processes (not the pools of processes the
    workers start for CPU work, which hold no watcher)."""
    main = psutil.Process(pid)
    serving = [main] if workers == 1 else main.children()
    return sum(int(p.memory_info().rss) for p in serving)


def _cpu(pid: int) -> float:
    return sum(float(t.user + t.system) for t in (p.cpu_times() for p in _processes(pid)))


class CpuMeter:
    """The CPU seconds each process of the run has used since the meter was made: the API
    server (with its workers), the reconciler, PostgreSQL serving the database (None when
    its processes are not on this machine) and this process (the clients)."""

    def __init__(self, server_pid: int, reconciler_pid: int, database: str) -> None:
        self._pids = {"api": server_pid, "reconciler": reconciler_pid}
        self._database = database
        self._start = {name: _cpu(pid) for name, pid in self._pids.items()}
        self._clients = time.process_time()
        self._postgres: dict[int, float] = postgres_cpu_seconds(database)

    def used(self) -> dict[str, float | None]:
        """Return the CPU seconds used so far, by process."""
        used: dict[str, float | None] = {
            name: _cpu(pid) - self._start[name] for name, pid in self._pids.items()}
        used["database"] = (postgres_cpu_seconds(self._database, self._postgres)
                            if self._postgres else None)
        used["clients"] = time.process_time() - self._clients
        return used


def _workers_up(pid: int, workers: int) -> None:
    """Wait until every worker process serves (a single worker is the main process)."""
    if workers > 1:
        while len(psutil.Process(pid).children()) < workers:
            time.sleep(0.2)
        time.sleep(3)  # each worker imports the app and opens its pool


async def _heartbeats(host: str, port: int, keys: list[tuple[str, str]]) -> None:
    while True:
        for instance, key in keys:
            await _request(host, port, "POST", f"/v1/runtimes/{instance}/heartbeat", key)
        await asyncio.sleep(3)


async def _pools(host: str, port: int, admin: str, count: int) -> None:
    for i in range(count):
        body = {"id": f"pool-{i}", "runtimeClass": SPEC["runtimeClass"],
                "runtimeInstanceId": f"rt-{i}", "region": "eu-west-1", "tenantIds": ["bench"]}
        status, answer = await _request(host, port, "POST", "/v1/pools", admin, body)
        if status != 201:
            raise RuntimeError(f"createPool answered {status}: {answer}")
        status, answer = await _request(host, port, "PUT", f"/v1/pools/pool-{i}/capacity",
                                        admin, CAPACITY)
        if status != 200:
            raise RuntimeError(f"putPoolCapacity answered {status}: {answer}")


async def _run(base: str, pid: int, keys: dict[str, Any], args: argparse.Namespace,
               *, reconciler_pid: int, database: str) -> dict[str, Any]:
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", int(parts.port or 80)
    await _pools(host, port, keys["admin"], args.pools)
    beats = asyncio.create_task(_heartbeats(host, port, keys["runtimes"]))
    tasks: list[asyncio.Task[None]] = []
    idle_count, granted = [0], [0]
    seen: dict[str, float] = {}
    progress = asyncio.Event()
    try:
        await asyncio.sleep(1)
        before = _rss(pid, args.workers)
        for _ in range(args.idle):
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(
                _stream(host, port, keys["idle"], "after=now", None, idle_count, ready)))
            await ready.wait()
        await asyncio.sleep(2)
        per_watcher = (_rss(pid, args.workers) - before) / max(args.idle, 1) / 1024
        for _instance, key in keys["runtimes"]:
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(_stream(
                host, port, key, "after=now&types=lease", seen, granted, ready, progress)))
            await ready.wait()
        submitter = Submitter(host, port, keys["tenant"])
        meter, t0 = CpuMeter(pid, reconciler_pid, database), time.perf_counter()
        sending = []
        for i in range(int(args.rate * args.seconds)):
            await asyncio.sleep(max(0.0, t0 + i / args.rate - time.perf_counter()))
            sending.append(asyncio.create_task(submitter.submit()))
        await asyncio.gather(*sending)
        # Every lease of a task sent is seen, or half a minute passes.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                while not submitter.sent.keys() <= seen.keys():
                    progress.clear()
                    await progress.wait()
        elapsed = time.perf_counter() - t0
        used = meter.used()
    finally:
        beats.cancel()
        for t in tasks:
            t.cancel()
    waits = sorted((seen[t] - s) * 1000 for t, s in submitter.sent.items() if t in seen)
    delivered = granted[0] + idle_count[0]
    accepted = len(submitter.sent)
    cpu = used["api"] or 0.0
    return {
        "apiWorkers": args.workers, "idleWatchers": args.idle, "runtimeWatchers": args.pools,
        "submitted": len(submitter.sent), "errors": submitter.errors,
        "rate": args.rate, "seconds": args.seconds,
        "seenByRuntime": len(waits),
        "p50Ms": round(statistics.median(waits), 1) if waits else None,
        "p99Ms": round(waits[int(0.99 * (len(waits) - 1))], 1) if waits else None,
        "eventsPerSec": round(delivered / elapsed, 1),
        "serverCpuMsPerEvent": round(1000 * cpu / delivered, 3) if delivered else None,
        "cpuMsPerSubmission": {
            name: round(1000 * seconds / accepted, 3) if accepted and seconds is not None
            else None for name, seconds in used.items()},
        "memoryPerWatcherKiB": round(per_watcher, 1),
        "loadAverage": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``berth bench watch``."""
    p = argparse.ArgumentParser(
        prog="berth bench watch",
        description="Measure the watch feed: N idle SSE watchers and one runtime watcher per "
        "pool while tasks are submitted at a fixed rate and placed by a reconciler, on a fresh "
        "database. Without --server-url or BERTH_DATABASE_URL, the fresh database is on an "
        "embedded PostgreSQL started in a temporary directory for the run.")
    p.add_argument("--server-url", default=env_server_url(), help=SERVER_HELP)
    p.add_argument("--idle", type=int, default=1000, help="idle watchers (1000)")
    p.add_argument("--pools", type=int, default=10,
                   help="pools, each with a runtime instance that watches its leases (10)")
    p.add_argument("--rate", type=float, default=1000.0, help="submissions per second (1000)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of submissions (10)")
    p.add_argument("--workers", type=int, default=1,
                   help="API worker processes (uvicorn --workers), as a deployment runs one "
                   "per core (1)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``berth bench watch`` and print one JSON line."""
    args = build_parser().parse_args(argv)
    with _fresh_database(args.server_url) as (url, described):
        keys: dict[str, Any] = {
            "admin": _key(url, "admin", "bench-admin"),
            "tenant": _key(url, "tenant", "bench-tenant", "--tenant", "bench"),
            "idle": _key(url, "tenant", "bench-idle", "--tenant", "idle"),
            "runtimes": [(f"rt-{i}", _key(url, "runtime", f"bench-rt-{i}",
                                          "--runtime-instance", f"rt-{i}"))
                         for i in range(args.pools)],
        }
        os.environ["BERTH_WATCH_MAX_WATCHERS_PER_KEY"] = str(max(args.idle, 1) + 10)
        reconciler = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "reconcile"], cwd=REPO_ROOT,
            env={**python_env(), "BERTH_DATABASE_URL": url, "BERTH_LOG_LEVEL": "warning"})
        try:
            with _uvicorn(url, _free_port(), 16, args.workers) as (base, pid):
                _workers_up(pid, args.workers)
                result = asyncio.run(_run(base, pid, keys, args, reconciler_pid=reconciler.pid,
                                          database=database_name(url)))
        finally:
            reconciler.terminate()
            reconciler.wait(timeout=20)
    result["server"] = described
    print(orjson.dumps(result).decode())
    return 0
