"""``berth bench parked``: the cost of parked tasks while placeable work streams through.

One run:

1. create a fresh database and migrate it with the code under test (``--code DIR``, default
   this repository; point it at an export of an older commit to measure "before");
2. load P pools (runtime class ``standard``, open to tenants ``flood`` and ``stream``, heart-
   beating) and admit N tasks of tenant ``flood`` that no pool can take (runtime class
   ``gpu-xl``, which no pool runs, as in issue 9's report);
3. start one ``berth reconcile`` of the code under test and wait until every flood task was
   looked at once (it carries a pending reason);
4. for ``--seconds``: submit ``--rate`` placeable ``stream`` tasks a second (the API's
   statement: task, ``submitted`` event, wakeup), and complete each leased stream task about
   ``--hold`` seconds after its lease (as a runtime would: capacity released, wakeup);
5. print ONE JSON line: the reconciler's and PostgreSQL's CPU seconds over the window (and per
   hour), ``task_events`` rows and bytes appended (and per hour), the flood tasks' claims,
   and the stream tasks' lease latency.

The per-hour figures extrapolate the window linearly: the workload is steady by design.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from app.bench.dataset import _maintenance, _with_database, database_drop, database_name
from app.bench.e2e import (
    DEFAULT_SERVER,
    REPO_ROOT,
    BenchFailed,
    _cpu_sample,
    _cpu_used,
    _died,
    _stop,
    _wait_ready,
)
from app.db import Database
from app.ledger.leases import lease_complete
from app.shards import shard_of

__all__ = ["ParkedConfig", "main", "parked_run"]

FLOOD = "flood"
STREAM = "stream"
HEARTBEAT_EVERY_SECONDS = 5.0


class ParkedConfig(argparse.Namespace):
    """One run's parameters (the parsed command line)."""

    parked: int
    pools: int
    rate: float
    seconds: float
    hold: float
    code: Path
    server_url: str
    logs: str | None


def _env(url: str, code: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["BERTH_DATABASE_URL"] = url
    env["BERTH_LEASE_TTL_SECONDS"] = "3600"
    env["BERTH_LOG_LEVEL"] = "info"
    env["PYTHONPATH"] = str(code)
    return env


async def _database(server_url: str, code: Path) -> str:
    name = f"berth_parked_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(_maintenance(server_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = _with_database(server_url, name)
    await asyncio.to_thread(_migrate, url, code)
    return url


def _migrate(url: str, code: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"], env=_env(url, code), cwd=code,
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise BenchFailed(f"berth migrate of {code} failed:\n{done.stderr[-2000:]}")


def _start_reconciler(url: str, code: Path, logdir: Path) -> subprocess.Popen:
    logdir.mkdir(parents=True, exist_ok=True)
    with open(logdir / "reconciler-0.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "reconcile"], env=_env(url, code),
            stdout=log, stderr=subprocess.STDOUT, cwd=code,
        )


async def _load(conn: asyncpg.Connection, cfg: ParkedConfig) -> None:
    ids = [f"pool-{i:04d}" for i in range(cfg.pools)]
    await conn.execute(
        "INSERT INTO pools (id, tenant_ids, runtime_class, runtime_instance_id, region) "
        "SELECT i, $2::text[], 'standard', 'rt-' || i, 'eu-west' FROM unnest($1::text[]) i",
        ids, [FLOOD, STREAM],
    )
    await conn.execute(
        "INSERT INTO ledgers (pool_id, cpu_total, memory_total, llm_total) "
        "SELECT i, 64000, 262144, 0 FROM unnest($1::text[]) i", ids,
    )
    await conn.execute(
        "INSERT INTO runtime_instances (id, last_heartbeat_at) "
        "SELECT 'rt-' || i, now() FROM unnest($1::text[]) i", ids,
    )
    spec = {"runtimeClass": "gpu-xl", "requests": {"cpuMillis": 1000, "memoryMiB": 0,
                                                   "llmSlots": 0},
            "priority": 0, "labels": {}, "maxAttempts": 3}
    await conn.execute(
        "WITH t AS (INSERT INTO tasks (id, tenant_id, shard, runtime_class, spec) "
        "SELECT gen_random_uuid(), $1, $2, 'gpu-xl', $3::jsonb FROM generate_series(1, $4) "
        "RETURNING id, admitted_at) "
        "INSERT INTO task_events (task_id, at, from_state, to_state, reason) "
        "SELECT id, admitted_at, NULL, 'ADMITTED', 'submitted' FROM t",
        FLOOD, shard_of(FLOOD), orjson.dumps(spec).decode(), cfg.parked,
    )


_SUBMIT = (
    "WITH t AS (INSERT INTO tasks (id, tenant_id, shard, runtime_class, spec, "
    "created_at, admitted_at, updated_at) "
    "SELECT gen_random_uuid(), $1, $2, 'standard', $3::jsonb, now(), now(), now() "
    "FROM generate_series(1, $4) RETURNING id, admitted_at), "
    "e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason) "
    "SELECT id, admitted_at, NULL, 'ADMITTED', 'submitted' FROM t) "
    "SELECT count(*), pg_notify('berth_wakeup', 'submitted') FROM t"
)


async def _submit(conn: asyncpg.Connection, n: int) -> None:
    spec = {"runtimeClass": "standard", "requests": {"cpuMillis": 500, "memoryMiB": 256,
                                                     "llmSlots": 0},
            "priority": 0, "labels": {}, "maxAttempts": 3}
    await conn.fetchrow(_SUBMIT, STREAM, shard_of(STREAM), orjson.dumps(spec).decode(), n)


async def _complete_due(db: Database, conn: asyncpg.Connection, hold: float) -> int:
    rows = await conn.fetch(
        "SELECT l.id, l.epoch FROM leases l WHERE l.state = 'ACTIVE' "
        "AND l.granted_at <= now() - make_interval(secs => $1) ORDER BY l.granted_at", hold,
    )
    for lease_id, epoch in rows:
        async with db.transaction() as tx:
            await lease_complete(tx, lease_id=lease_id, epoch=epoch, outcome="succeeded",
                                 message=None, now=datetime.now(UTC), instance_ids=None)
    return len(rows)


async def _events(conn: asyncpg.Connection) -> tuple[int, int]:
    count = await conn.fetchval("SELECT count(*) FROM task_events")
    size = await conn.fetchval("SELECT pg_total_relation_size('task_events')")
    return int(count), int(size)


async def parked_run(cfg: ParkedConfig) -> dict[str, Any]:
    """Run the benchmark and return its one-line JSON result."""
    url = await _database(cfg.server_url, cfg.code)
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="berth-parked-") as tmp:
        logdir = Path(cfg.logs or tmp)
        conn = await asyncpg.connect(url)
        db = Database(url, max_size=2)
        await db.open()
        try:
            await _load(conn, cfg)
            procs.append(_start_reconciler(url, cfg.code, logdir))
            await _wait_ready(conn, procs, logdir, 60.0)
            deadline = time.monotonic() + 120
            while await conn.fetchval(
                "SELECT count(*) FROM tasks WHERE pending_reason IS NULL AND tenant_id = $1",
                FLOOD,
            ):
                _died(procs, logdir)
                if time.monotonic() > deadline:
                    raise BenchFailed("the flood tasks were not all looked at within 120 s")
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            database = database_name(url)
            flood_events_before = await conn.fetchval(
                "SELECT count(*) FROM task_events e JOIN tasks t ON t.id = e.task_id "
                "WHERE t.tenant_id = $1", FLOOD)
            events_before, bytes_before = await _events(conn)
            cpu_before = _cpu_sample(procs, database)
            started = time.monotonic()
            window_start = await conn.fetchval("SELECT now()")
            submitted = completed = 0
            last_beat = started
            tick = 0
            while (now := time.monotonic()) - started < cfg.seconds:
                tick += 1
                due = int(cfg.rate * (now - started)) - submitted
                if due > 0:
                    await _submit(conn, due)
                    submitted += due
                completed += await _complete_due(db, conn, cfg.hold)
                if now - last_beat >= HEARTBEAT_EVERY_SECONDS:
                    await conn.execute("UPDATE runtime_instances SET last_heartbeat_at = now()")
                    last_beat = now
                _died(procs, logdir)
                await asyncio.sleep(0.05)
            elapsed = time.monotonic() - started
            cpu = _cpu_used(cpu_before, _cpu_sample(procs, database))
            events_after, bytes_after = await _events(conn)
            flood_events = await conn.fetchval(
                "SELECT count(*) FROM task_events e JOIN tasks t ON t.id = e.task_id "
                "WHERE t.tenant_id = $1", FLOOD) - flood_events_before
            latency = await conn.fetchrow(
                "SELECT count(*) AS leased, "
                "percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50, "
                "percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99 FROM ("
                "SELECT extract(epoch FROM leased_at - admitted_at) * 1000 AS ms FROM tasks "
                "WHERE tenant_id = $1 AND leased_at IS NOT NULL AND admitted_at >= $2) x",
                STREAM, window_start)
        finally:
            _stop(procs)
            await conn.close()
            await db.close()
            await database_drop(cfg.server_url, url)
    per_hour = 3600.0 / elapsed
    return {
        "code": str(cfg.code),
        "parked": cfg.parked,
        "pools": cfg.pools,
        "rate": cfg.rate,
        "seconds": round(elapsed, 1),
        "submitted": submitted,
        "completed": completed,
        "streamLeased": latency["leased"],
        "streamP50LeaseMs": round(float(latency["p50"] or 0), 1),
        "streamP99LeaseMs": round(float(latency["p99"] or 0), 1),
        "cpuSeconds": cpu,
        "reconcilerCpuPerHour": round(cpu["reconcilers"] * per_hour, 0),
        "reconcilerCpuShare": round(cpu["reconcilers"] / elapsed, 3),
        "postgresCpuShare": round(cpu["postgres"] / elapsed, 3),
        "eventRows": events_after - events_before,
        "eventRowsPerHour": round((events_after - events_before) * per_hour),
        "floodEventRows": flood_events,
        "eventBytesPerHour": round((bytes_after - bytes_before) * per_hour),
        "eventMiBPerHour": round((bytes_after - bytes_before) * per_hour / 2**20, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``berth bench parked``."""
    p = argparse.ArgumentParser(
        prog="berth bench parked",
        description="Measure a reconciler's CPU and task_events growth with many parked "
                    "unplaceable tasks while placeable tasks stream through.",
    )
    p.add_argument("--parked", type=int, default=10000,
                   help="unplaceable tasks (default 10000)")
    p.add_argument("--pools", type=int, default=50, help="pools (default 50)")
    p.add_argument("--rate", type=float, default=20.0,
                   help="placeable tasks submitted per second (default 20)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="length of the measured window (default 60)")
    p.add_argument("--hold", type=float, default=1.0,
                   help="seconds a placed task runs before its lease completes (default 1)")
    p.add_argument("--code", type=Path, default=REPO_ROOT,
                   help="source tree whose reconciler and migrations run (default: this one; "
                        "e.g. a `git archive` export of an older commit)")
    p.add_argument("--server-url", default=os.environ.get("BERTH_DATABASE_URL") or DEFAULT_SERVER,
                   help="PostgreSQL server to create the benchmark database on")
    p.add_argument("--logs", metavar="DIR", help="keep the reconciler's log in DIR")
    return p


def main(argv: list[str]) -> int:
    """Run ``berth bench parked`` with ``argv`` and print one JSON line."""
    cfg = build_parser().parse_args(argv, namespace=ParkedConfig())
    if cfg.parked < 0 or cfg.pools < 1 or cfg.rate <= 0 or cfg.seconds <= 0:
        raise SystemExit("berth bench parked: --pools, --rate and --seconds must be positive")
    cfg.code = cfg.code.resolve()
    try:
        result = asyncio.run(parked_run(cfg))
    except BenchFailed as exc:
        print(f"berth bench parked: {exc}", file=sys.stderr)
        return 1
    print(orjson.dumps(result).decode(), flush=True)
    return 0
