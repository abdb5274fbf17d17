"""``berth bench api``: HTTP throughput of task submission and reads over loopback.

Starts one uvicorn worker (uvloop, httptools) serving Berth on a fresh database — a new
database on the server of ``--server-url`` (default ``BERTH_DATABASE_URL``, else an embedded
PostgreSQL in a temporary directory), dropped afterwards — with NO reconciler, so only the
API and its SQL are measured; or targets a running server with ``--url`` and a tenant
``--key``. A tenant key is created (``berth keys create``), then N concurrent keep-alive
clients drive ``POST /v1/tasks`` for a bounded time (or count), then ``GET /v1/tasks/{id}``
over the created tasks, then a few clients drive ``POST /v1/task-batches`` with ``--batch-
size`` specs each (tasks accepted per second and server CPU per task; ``--batch-size 0``
skips it), then — with its own server — loads ``--preview-pools`` pools (10,000) the tenant
sees and times ``--previews`` placement previews one at a time, their default page: p50,
p99, the largest answer in bytes and the rows each preview's snapshot refresh read
(``--preview-pools 0`` skips it; ``--preview-writes`` and ``--preview-hold`` write to the
pools meanwhile, as reconcilers do). The clients run in a
separate process with a minimal HTTP/1.1 client so that they
cost the server as little CPU as possible; on a small machine client, server and PostgreSQL
still share the cores, which the output reports.

Shows its phases on stderr while it runs, then prints a short table of the headline figures;
with ``--json``, ONE JSON line instead::

    {"submissions": {"count", "rps", "p50Ms", "p99Ms", "errors"}, "reads": {...},
     "batches": {..., "tasksAccepted", "batchSize"}, "batchTasksPerSec",
     "batchDatabaseCpuMsPerTask",
     "batchServerCpuMsPerTask", "previews": {"pools", "count", "p50Ms", "p99Ms", "bytesMax",
     "apiProcessCpuMsPerRequest", "workersCpuMsPerRequest", "rowsReadPerPreview",
     "writer": {"passesPerSecond", "ledgerRowsPerSecond", "held"}}, "clients": N, "cpus": 2,
     "server": "...", ...}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
import psutil

from bench.database import (
    SERVER_HELP,
    database_create,
    database_drop,
    database_name,
    env_server_url,
    postgres_server,
)
from bench.preview_pools import PoolsWriter, preview_pools_load
from bench.report import Progress, json_option, result_print
from bench.workers import REPO_ROOT, postgres_cpu_seconds, python_env

SPEC = {
    "runtimeClass": "python-3.11",
    "requests": {"cpuMillis": 250, "memoryMiB": 256},
    "constraints": {"regions": ["eu-west-1", "eu-central-1"]},
    "labels": {"app": "bench"},
}


# --- a minimal keep-alive HTTP/1.1 client (the bench client process) --------------------------


@dataclass
class PhaseResult:
    """Latencies (seconds) of the successful requests of a phase, errors, wall time, ids."""

    latencies: list[float]
    errors: int
    elapsed: float
    ids: list[str]
    statuses: dict[int, int]
    #: Items answered 201 in the batches of a ``batch`` phase.
    accepted: int = 0
    #: Body sizes (bytes) of the successful answers of a ``preview`` phase.
    sizes: list[int] = field(default_factory=list)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
            break
    body = await reader.readexactly(length) if length else b""
    return status, body


async def _client(
    host: str,
    port: int,
    requests: list[bytes],
    deadline: float,
    out: PhaseResult,
    phase: str,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for raw in requests:
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            writer.write(raw)
            status, body = await _read_response(reader)
            took = time.perf_counter() - start
            out.statuses[status] = out.statuses.get(status, 0) + 1
            if 200 <= status < 300:
                out.latencies.append(took)
                if phase == "submit":
                    out.ids.append(orjson.loads(body)["id"])
                elif phase == "preview":
                    out.sizes.append(len(body))
                elif phase == "batch":
                    # Counted in the text, not parsed: the client shares the cores with the
                    # server. Only an item's result has a "status" (a task has a "state",
                    # a problem's status is 4xx), and the bench's spec holds no such text.
                    out.accepted += body.count(b'"status":201')
            else:
                out.errors += 1
    finally:
        writer.close()


def _post(host: str, key: str, body: bytes, path: bytes = b"/v1/tasks") -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
        + b"\r\n\r\n" + body
    )


def _get(host: str, key: str, task_id: str) -> bytes:
    return (
        b"GET /v1/tasks/" + task_id.encode() + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n\r\n"
    )


def drive(
    url: str,
    key: str,
    *,
    phase: str,
    clients: int,
    count: int,
    seconds: float,
    ids: Sequence[str] = (),
    batch_size: int = 1000,
) -> PhaseResult:
    """Run one phase (``submit``, ``read``, ``preview`` (placement previews of the spec) or
    ``batch``: ``count`` requests of ``batch_size`` specs) with ``clients`` connections;
    return its result."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        pass
    parsed = urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    host_port = parsed.netloc
    body = orjson.dumps(SPEC)
    per = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]
    if phase == "submit":
        batches = [[_post(host_port, key, body)] * n for n in per]
    elif phase == "preview":
        batches = [[_post(host_port, key, body, b"/v1/placements/preview")] * n for n in per]
    elif phase == "batch":
        batch = orjson.dumps({"items": [{"spec": SPEC}] * batch_size})
        batches = [[_post(host_port, key, batch, b"/v1/task-batches")] * n for n in per]
    else:
        batches = []
        start = 0
        for n in per:
            chunk = [ids[(start + j) % len(ids)] for j in range(n)]
            batches.append([_get(host_port, key, t) for t in chunk])
            start += n
    out = PhaseResult([], 0, 0.0, [], {})

    async def main() -> None:
        t0 = time.perf_counter()
        deadline = t0 + seconds
        await asyncio.gather(
            *(_client(host, port, b, deadline, out, phase) for b in batches)
        )
        out.elapsed = time.perf_counter() - t0

    asyncio.run(main())
    return out


def _summary(result: PhaseResult) -> dict[str, Any]:
    lat = sorted(result.latencies)
    n = len(lat)

    def pct(p: float) -> float:
        return round(lat[min(n - 1, int(p * n))] * 1000, 2) if n else 0.0

    return {
        "count": n,
        "errors": result.errors,
        "seconds": round(result.elapsed, 2),
        "rps": round(n / result.elapsed, 1) if result.elapsed else 0.0,
        "p50Ms": pct(0.50),
        "p99Ms": pct(0.99),
        "statuses": {str(k): v for k, v in sorted(result.statuses.items())},
    }


# --- the server under test ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _fresh_database(server_url: str | None) -> Iterator[tuple[str, str]]:
    """Yield (url, description) of a fresh migrated database on ``server_url`` (or on an
    embedded PostgreSQL started for the run), dropped afterwards."""
    with postgres_server(server_url) as (server, described):
        url = asyncio.run(database_create(server))
        try:
            yield url, f"fresh database on {described}"
        finally:
            asyncio.run(database_drop(server, url))


def _tenant_key(url: str, tenant: str) -> str:
    """Create a tenant key with ``berth keys create`` and return it."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "create", "--role", "tenant",
         "--subject", f"bench-{tenant}", "--tenant", tenant],
        cwd=REPO_ROOT, env={**python_env(), "BERTH_DATABASE_URL": url},
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"berth keys create failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


@contextmanager
def _uvicorn(database_url: str, port: int, pool_size: int,  # type: ignore[no-untyped-def]
             workers: int = 1):
    """Run uvicorn serving Berth (no reconciler) with ``workers`` worker processes (each
    with a pool of ``pool_size``); yield its base URL and the pid of its main process."""
    env = {
        **os.environ,
        "BERTH_DATABASE_URL": database_url,
        "BERTH_RECONCILER_ENABLED": "false",
        "BERTH_DB_POOL_SIZE": str(pool_size),
        "BERTH_LOG_LEVEL": "warning",
    }
    cmd = [
        sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--loop", "uvloop", "--http", "httptools", "--log-level", "warning",
        "--no-access-log", "--no-server-header",
    ]
    # A session (process group) of its own: whatever it starts can be stopped with it.
    proc = subprocess.Popen(cmd, env={**python_env(), **env}, cwd=REPO_ROOT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        _stop_tree(proc)


def _stop_tree(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server and every process it started (workers, and the pools of processes
    they run CPU work in: orphaned, they would hold the bench's output open)."""
    import psutil

    try:
        started = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    for child in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(started, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    # Processes whose parent died before it could be asked are still in its group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


# --- the command ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``berth bench api``."""
    p = argparse.ArgumentParser(
        prog="berth bench api",
        description="Measure the HTTP throughput of task submission and reads over loopback: "
        "one uvicorn worker serving Berth (no reconciler) on a fresh database, or a running "
        "server with --url. Without --server-url or BERTH_DATABASE_URL, the fresh database is "
        "on an embedded PostgreSQL started in a temporary directory for the run.",
    )
    p.add_argument("--url", help="target a running server instead of starting one")
    p.add_argument("--server-url", default=env_server_url(), help=SERVER_HELP)
    p.add_argument("--key", help="tenant API key for --url")
    p.add_argument("--clients", type=int, default=32, help="concurrent connections (32)")
    p.add_argument("--count", type=int, default=20000, help="max submissions (20000)")
    p.add_argument("--reads", type=int, default=20000, help="max reads (20000)")
    p.add_argument("--seconds", type=float, default=10.0, help="max seconds per phase (10)")
    p.add_argument("--warmup", type=int, default=500, help="unmeasured submissions first (500)")
    p.add_argument("--pool-size", type=int, default=16, help="server DB connections (16)")
    p.add_argument("--batch-size", type=int, default=1000,
                   help="specs per POST /v1/task-batches (1000; 0 skips the batch phase)")
    p.add_argument("--batches", type=int, default=50, help="max batches (50)")
    p.add_argument("--batch-clients", type=int, default=4,
                   help="concurrent connections of the batch phase (4)")
    json_option(p)
    p.add_argument("--preview-pools", type=int, default=10000,
                   help="pools loaded for the placement preview phase, its own server only "
                   "(10000; 0 skips the phase)")
    p.add_argument("--previews", type=int, default=50,
                   help="placement previews of the preview phase, one at a time (50)")
    p.add_argument("--preview-writes", type=float, default=0.0,
                   help="passes a second a writer commits while the previews run, each "
                   "reserving on --preview-write-pools pools and releasing the previous "
                   "pass's, as reconcilers do (0: none, the default)")
    p.add_argument("--preview-write-pools", type=int, default=20,
                   help="pools each pass of the writer reserves on (20)")
    p.add_argument("--preview-hold", action="store_true",
                   help="keep a transaction that has an id open while the previews run, as a "
                   "long pass or batch does")
    return p


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _children_cpu_seconds(pid: int) -> float:
    """Return the CPU time of the processes ``pid`` started (its preview workers)."""
    total = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _shown(progress: Progress, name: str, total: int, unit: str,
           running: Future[PhaseResult]) -> PhaseResult:
    """Show the phase ``name`` on ``progress`` while ``running`` works; return its result."""
    progress.phase(name, total=total, unit=unit)
    result = running.result()
    done = len(result.latencies)
    progress.end(done, rate=done / result.elapsed if result.elapsed else None)
    return result


def _measure(
    url: str, key: str, args: argparse.Namespace, progress: Progress,
    server_pid: int | None = None, batch_key: str | None = None, database: str | None = None,
) -> dict[str, Any]:
    """Run the warm-up, submission and read phases; return their summaries.

    With the server's pid, each summary also gives the server's CPU time per request: unlike
    requests/s it hardly depends on what else the machine is running. Batches are sent with
    ``batch_key`` (another tenant's, so that they and the single submissions stay within
    ``BERTH_MAX_QUEUED_TASKS_PER_TENANT`` each), else with ``key``. With the ``database``
    name (a server on this machine), the batch phase also reports PostgreSQL's CPU per task.
    """
    batch_key = batch_key or key
    with ProcessPoolExecutor(max_workers=1) as pool:
        if args.warmup:
            _shown(progress, "warm-up", args.warmup, "requests",
                   pool.submit(drive, url, key, phase="submit", clients=args.clients,
                               count=args.warmup, seconds=args.seconds))
        cpu0 = _cpu_seconds(server_pid)
        submitted = _shown(progress, "submissions", args.count, "tasks",
                           pool.submit(drive, url, key, phase="submit", clients=args.clients,
                                       count=args.count, seconds=args.seconds))
        cpu1 = _cpu_seconds(server_pid)
        ids = submitted.ids
        if not ids:
            raise RuntimeError(f"no submission succeeded (statuses {submitted.statuses})")
        reads = _shown(progress, "reads", args.reads, "reads",
                       pool.submit(drive, url, key, phase="read", clients=args.clients,
                                   count=args.reads, seconds=args.seconds, ids=ids))
        cpu2 = _cpu_seconds(server_pid)
        batches = None
        if args.batch_size:
            # One warm-up batch per connection, then the measured ones.
            _shown(progress, "batch warm-up", args.batch_clients, "batches",
                   pool.submit(drive, url, batch_key, phase="batch", clients=args.batch_clients,
                               count=args.batch_clients, seconds=args.seconds,
                               batch_size=args.batch_size))
            cpu3 = _cpu_seconds(server_pid)
            pg3 = postgres_cpu_seconds(database) if database else None
            batches = _shown(progress, "batches", args.batches, "batches",
                             pool.submit(drive, url, batch_key, phase="batch",
                                         clients=args.batch_clients,
                                         count=args.batches, seconds=args.seconds,
                                         batch_size=args.batch_size))
            cpu4 = _cpu_seconds(server_pid)
            pg_batches = postgres_cpu_seconds(database, pg3) if pg3 is not None else None
    out: dict[str, Any] = {"submissions": _summary(submitted), "reads": _summary(reads)}
    if server_pid is not None:
        for name, phase, cpu in (("submissions", submitted, cpu1 - cpu0),
                                 ("reads", reads, cpu2 - cpu1)):
            if phase.latencies:
                out[name]["serverCpuMsPerRequest"] = round(cpu / len(phase.latencies) * 1000, 3)
    if batches is not None:
        summary = _summary(batches)
        summary.update(batchSize=args.batch_size, clients=args.batch_clients,
                       tasksAccepted=batches.accepted)
        out["batches"] = summary
        out["batchTasksPerSec"] = (
            round(batches.accepted / batches.elapsed, 1) if batches.elapsed else 0.0
        )
        if server_pid is not None and batches.accepted:
            out["batchServerCpuMsPerTask"] = round((cpu4 - cpu3) / batches.accepted * 1000, 4)
        if pg_batches is not None and batches.accepted:
            out["batchDatabaseCpuMsPerTask"] = round(pg_batches / batches.accepted * 1000, 4)
    return out


def _rows_read(url: str) -> tuple[float, float] | None:
    """Return the sum and count of ``berth_preview_rows_read`` on the server's /metrics
    (None: it does not export them)."""
    import httpx

    found: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("berth_preview_rows_read_sum", "berth_preview_rows_read_count"):
            found[name] = float(value)
    if len(found) < 2:
        return None
    return found["berth_preview_rows_read_sum"], found["berth_preview_rows_read_count"]


def _previews(
    database: str, url: str, key: str, args: argparse.Namespace, server_pid: int
) -> dict[str, Any]:
    """Load ``--preview-pools`` pools for the tenant of ``key``, then time ``--previews``
    placement previews of the benchmark's spec with their default page, one at a time
    (with ``--preview-writes``, while a writer reserves on the pools)."""
    asyncio.run(preview_pools_load(database, pools=args.preview_pools, tenant="bench-tenant"))
    writer = None
    if args.preview_writes > 0 or args.preview_hold:
        writer = PoolsWriter(database, pools=args.preview_pools, rate=args.preview_writes,
                             per_pass=args.preview_write_pools if args.preview_writes else 0,
                             hold=args.preview_hold)
        writer.start()
    try:
        with ProcessPoolExecutor(max_workers=1) as pool:
            # Warm-up: the first previews read the new pools and start the preview workers.
            pool.submit(drive, url, key, phase="preview", clients=1, count=3,
                        seconds=args.seconds).result()
            rows0 = _rows_read(url)
            cpu0, workers0 = _cpu_seconds(server_pid), _children_cpu_seconds(server_pid)
            done = pool.submit(drive, url, key, phase="preview", clients=1,
                               count=args.previews, seconds=args.seconds).result()
            cpu1, workers1 = _cpu_seconds(server_pid), _children_cpu_seconds(server_pid)
            rows1 = _rows_read(url)
    finally:
        written = writer.stop() if writer is not None else None
    summary = _summary(done)
    summary["pools"] = args.preview_pools
    if done.sizes:
        summary["bytesMax"] = max(done.sizes)
        summary["apiProcessCpuMsPerRequest"] = round((cpu1 - cpu0) / len(done.sizes) * 1000, 2)
        summary["workersCpuMsPerRequest"] = round(
            (workers1 - workers0) / len(done.sizes) * 1000, 2)
    if rows0 is not None and rows1 is not None and rows1[1] > rows0[1]:
        summary["rowsReadPerPreview"] = round((rows1[0] - rows0[0]) / (rows1[1] - rows0[1]), 1)
    if written is not None:
        summary["writer"] = {
            "passesPerSecond": round(written.passes / written.seconds, 1)
            if written.seconds else 0.0,
            "ledgerRowsPerSecond": round(written.rows / written.seconds, 1)
            if written.seconds else 0.0,
            "held": args.preview_hold,
        }
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Run the API benchmark and print one JSON line; return the exit status."""
    args = build_parser().parse_args(list(argv or []))
    if args.clients < 1 or args.count < 1 or args.seconds <= 0:
        print("berth bench api: --clients, --count and --seconds must be positive",
              file=sys.stderr)
        return 2
    if (args.preview_pools < 0 or args.previews < 1 or args.preview_writes < 0
            or args.preview_write_pools < 1):
        print("berth bench api: --preview-pools and --preview-writes are 0 or more, "
              "--previews and --preview-write-pools positive", file=sys.stderr)
        return 2
    if not 0 <= args.batch_size <= 1000 or args.batches < 1 or args.batch_clients < 1:
        print("berth bench api: --batch-size is 0..1000, --batches and --batch-clients "
              "positive", file=sys.stderr)
        return 2
    info: dict[str, Any] = {
        "clients": args.clients,
        "cpus": os.cpu_count(),
        # Other work on the machine competes for the same cores: report it with the figures.
        "loadAverage1m": round(os.getloadavg()[0], 2),
        "clientProcess": "separate process, raw HTTP/1.1 keep-alive on uvloop",
        "reconciler": "disabled (API only)",
    }
    if args.url:
        if not args.key:
            print("berth bench api: --url needs --key (a tenant API key)", file=sys.stderr)
            return 2
        info["server"] = args.url
        with Progress("berth bench api") as progress:
            result = _measure(args.url, args.key, args, progress)
    else:
        with ExitStack() as stack:
            progress = stack.enter_context(Progress("berth bench api"))
            progress.phase("starting the server on a fresh database")
            url, described = stack.enter_context(_fresh_database(args.server_url))
            key = _tenant_key(url, "bench-tenant")
            batch_key = _tenant_key(url, "bench-batch-tenant")
            base, pid = stack.enter_context(_uvicorn(url, _free_port(), args.pool_size))
            info["server"] = "uvicorn, 1 worker, uvloop + httptools, same machine"
            info["database"] = described
            result = _measure(base, key, args, progress, pid, batch_key, database_name(url))
            if args.preview_pools:
                progress.phase(f"previews over {args.preview_pools:,} pools")
                result["previews"] = _previews(url, base, key, args, pid)
                progress.end(args.previews)
    result_print({**result, **info}, as_json=args.json, title=_title(info), rows=_headline)
    return 0


def _title(info: dict[str, Any]) -> str:
    return (f"berth bench api: {info['clients']} clients; {info['server']}; {info['cpus']} "
            f"CPUs, load {info['loadAverage1m']}")


def _headline(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Return the figures a person reads first, as (name, value) rows."""
    rows = []
    for name in ("submissions", "reads"):
        s = r[name]
        cpu = s.get("serverCpuMsPerRequest")
        rows.append((name, f"{s['rps']:,.1f}/s, p50 {s['p50Ms']} ms, p99 {s['p99Ms']} ms"
                           + (f", server CPU {cpu} ms/request" if cpu is not None else "")
                           + (f", {s['errors']:,} errors" if s["errors"] else "")))
    if "batches" in r:
        b = r["batches"]
        cpu = r.get("batchServerCpuMsPerTask")
        rows.append(("tasks in batches", f"{r['batchTasksPerSec']:,.1f}/s in batches of "
                                         f"{b['batchSize']:,}"
                                         + (f", server CPU {cpu} ms/task" if cpu else "")))
    if "previews" in r:
        p = r["previews"]
        read = p.get("rowsReadPerPreview")
        w = p.get("writer")
        rows.append(("placement previews", f"{p['pools']:,} pools: p50 {p['p50Ms']} ms, "
                                           f"p99 {p['p99Ms']} ms, {p.get('bytesMax', 0):,} bytes"
                                           + (f", {read:,} rows read each" if read is not None
                                              else "")
                                           + (f"; writer {w['passesPerSecond']} passes/s"
                                              + (", a transaction held open" if w["held"]
                                                 else "") if w else "")))
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
