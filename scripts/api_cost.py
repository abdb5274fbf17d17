"""Server cost of one task submit and one task read, in-process and deterministic enough to
compare two source trees: the app of the tree on PYTHONPATH, no HTTP server, no client
process.

Builds the app on a fresh database (as ``berth bench api`` does), sends ``--warmup`` submits
and reads, then ``--n`` submits and ``--n`` reads by ``--concurrency`` coroutines calling the
ASGI app directly (the same requests as the bench's clients), and prints one JSON line:
process CPU ms and PostgreSQL backend CPU ms per request. Under callgrind (``--callgrind``,
see scripts/api_cost.sh) it counts instructions per request instead, which does not depend on
what else the machine runs. The queue snapshot of getTask is then kept for an hour
(``BERTH_QUEUE_SNAPSHOT_SECONDS``), and the key cache's time-to-live too, so that the
instruction counts are those of the requests, not of refreshes that the slowdown of
callgrind makes more frequent.

    cd TREE && PYTHONPATH=$PWD python /path/to/scripts/api_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import sys
import time
from typing import Any

import orjson

SPEC = {
    "runtimeClass": "python-3.11",
    "requests": {"cpuMillis": 250, "memoryMiB": 256},
    "constraints": {"regions": ["eu-west-1", "eu-central-1"]},
    "labels": {"app": "bench"},
}


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        "scheme": "http", "method": method, "root_path": "", "path": path,
        "raw_path": path.encode(), "query_string": b"", "headers": headers, "state": {},
    }


async def _call(app: Any, method: str, path: str, headers: list, body: bytes) -> tuple[int, bytes]:
    sent = False
    status, chunks = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(_scope(method, path, headers), receive, send)
    return status, b"".join(chunks)


async def _backends_cpu(url: str) -> float:
    import asyncpg
    import psutil

    conn = await asyncpg.connect(url)
    try:
        pids = [r[0] for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")]
    finally:
        await conn.close()
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class _Callgrind:
    """Callgrind's client requests (valgrind/callgrind.h), from a small library built on the fly."""

    def __init__(self, library: str) -> None:
        self._lib = ctypes.CDLL(library)

    def start(self) -> None:
        self._lib.cg_start()
        self._lib.cg_zero()

    def stop(self, label: str) -> None:
        self._lib.cg_dump(label.encode())
        self._lib.cg_stop()


async def _run(args: argparse.Namespace, url: str, key: str) -> dict[str, Any]:
    from app.main import create_app

    app = create_app()
    body = orjson.dumps(SPEC)
    batch = orjson.dumps({"items": [{"spec": SPEC}] * args.batch_size})
    auth = (b"authorization", b"Bearer " + key.encode())
    post = [(b"host", b"127.0.0.1:8000"), auth, (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]
    get = [(b"host", b"127.0.0.1:8000"), auth]
    post_batch = [*post[:3], (b"content-length", str(len(batch)).encode())]
    grind = _Callgrind(args.callgrind) if args.callgrind else None
    ids: list[str] = []
    statuses: dict[int, int] = {}

    async def phase(kind: str, n: int) -> None:
        todo = iter(range(n))

        async def worker() -> None:
            for i in todo:
                if kind == "submit":
                    status, answer = await _call(app, "POST", "/v1/tasks", post, body)
                    if status == 201:
                        ids.append(orjson.loads(answer)["id"])
                elif kind == "batch":
                    status, answer = await _call(app, "POST", "/v1/task-batches", post_batch,
                                                 batch)
                    status = status if answer.count(b'"status":201') == args.batch_size else 0
                else:
                    status, _ = await _call(app, "GET", f"/v1/tasks/{ids[i % len(ids)]}", get, b"")
                statuses[status] = statuses.get(status, 0) + 1

        clients = args.batch_clients if kind == "batch" else args.concurrency
        await asyncio.gather(*(worker() for _ in range(clients)))

    out: dict[str, Any] = {}
    async with app.router.lifespan_context(app):
        if grind is not None:
            app.state.key_cache.ttl = 1e9
        await phase("submit", args.warmup)
        await phase("read", args.warmup)
        kinds = ["submit", "read"]
        if args.batches:
            await phase("batch", args.batch_clients)
            kinds.append("batch")
        for kind in kinds:
            n = args.batches if kind == "batch" else args.n
            pg0 = await _backends_cpu(url)
            if grind is not None:
                grind.start()
            cpu0 = time.process_time()
            await phase(kind, n)
            cpu1 = time.process_time()
            if grind is not None:
                grind.stop(kind)
            pg1 = await _backends_cpu(url)
            if kind == "batch":  # per task
                n *= args.batch_size
            out[kind] = {"cpuMsPerRequest": round((cpu1 - cpu0) / n * 1000, 4),
                         "postgresCpuMsPerRequest": round((pg1 - pg0) / n * 1000, 4)}
    out["statuses"] = {str(k): v for k, v in sorted(statuses.items())}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="measured submits and reads")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--batches", type=int, default=0,
                        help="measured POST /v1/task-batches too (0: none); figures per task")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--batch-clients", type=int, default=4)
    parser.add_argument("--callgrind", help="library of callgrind client requests (api_cost.sh)")
    args = parser.parse_args()
    if args.callgrind:
        os.environ["BERTH_QUEUE_SNAPSHOT_SECONDS"] = "3600"
    os.environ.setdefault("BERTH_LOG_LEVEL", "warning")
    os.environ["BERTH_RECONCILER_ENABLED"] = "false"
    os.environ["BERTH_DB_POOL_SIZE"] = "16"
    server = os.environ.get("BERTH_DATABASE_URL")
    if not server:
        print("api_cost: set BERTH_DATABASE_URL to a PostgreSQL server", file=sys.stderr)
        return 2
    import uvloop

    from app.bench.api import _fresh_database, _tenant_key

    with _fresh_database(server) as (url, _):
        key = asyncio.run(_tenant_key(url, "bench-tenant"))
        os.environ["BERTH_DATABASE_URL"] = url
        result = uvloop.run(_run(args, url, key))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
