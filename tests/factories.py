"""Shared test data builders: pools with ledgers, runtime heartbeats and tasks, via the tables.

Everything is inserted straight into the schema (no HTTP), in bulk where it matters, so a
test can set up 10,000 tasks in a fraction of a second. Use from any test package::

    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(4000, 8192, 0), now=NOW)
        await heartbeat_add(conn, "rt-p1", at=NOW)
        ids = await tasks_add(conn, tenant="t1", count=100, spec=spec_make(cpu=100))
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx
import orjson

from app.db import Connection, Database
from app.dburl import database_url_parse
from app.ledger.claims import tasks_unpark
from app.scheduling.explain import placement_document, placement_stored
from app.scheduling.results import Candidate
from app.shards import SHARD_SLOTS, shard_of

if TYPE_CHECKING:
    from app.reconciler import Reconciler

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def spec_make(
    *,
    cpu: int = 100,
    memory: int = 0,
    llm: int = 0,
    runtime_class: str = "standard",
    priority: int = 0,
    labels: Mapping[str, str] | None = None,
    max_attempts: int = 3,
    **extra: Any,
) -> dict[str, Any]:
    """Return a camelCase task spec (as POST /v1/tasks takes it)."""
    spec: dict[str, Any] = {
        "runtimeClass": runtime_class,
        "requests": {"cpuMillis": cpu, "memoryMiB": memory, "llmSlots": llm},
        "priority": priority,
        "labels": dict(labels or {}),
        "maxAttempts": max_attempts,
    }
    spec.update(extra)
    return spec


async def pool_add(
    conn: Connection,
    pool_id: str,
    *,
    tenants: Iterable[str],
    capacity: tuple[int, int, int] | None = (4000, 8192, 0),
    reserved: tuple[int, int, int] = (0, 0, 0),
    runtime_class: str = "standard",
    runtime_instance_id: str | None = None,
    region: str = "eu-west",
    failure_domain: str = "",
    labels: Mapping[str, str] | None = None,
    status: str = "ACTIVE",
    ready: bool = True,
    drain_deadline: datetime | None = None,
    cost_weight: float = 1.0,
) -> str:
    """Insert a pool (and its ledger unless ``capacity`` is None); return its runtime id."""
    instance = runtime_instance_id or f"rt-{pool_id}"
    await conn.execute(
        "INSERT INTO pools (id, tenant_ids, runtime_class, runtime_instance_id, region, "
        "failure_domain, labels, status, ready, drain_deadline, cost_weight) VALUES "
        "($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11)",
        pool_id, list(tenants), runtime_class, instance, region, failure_domain,
        dict(labels or {}), status, ready, drain_deadline, cost_weight,
    )
    if capacity is not None:
        await conn.execute(
            "INSERT INTO ledgers (pool_id, cpu_total, memory_total, llm_total, "
            "cpu_reserved, memory_reserved, llm_reserved) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7)",
            pool_id, capacity[0], capacity[1], capacity[2], reserved[0], reserved[1], reserved[2],
        )
    return instance


async def pools_add(
    conn: Connection,
    count: int,
    *,
    tenants: Iterable[str],
    capacity: tuple[int, int, int] = (4000, 8192, 0),
    prefix: str = "pool",
    runtime_class: str = "standard",
    heartbeat_at: datetime | None = NOW,
) -> list[str]:
    """Insert ``count`` healthy pools in bulk (ledgers and heartbeats too); return their ids."""
    ids = [f"{prefix}-{i:05d}" for i in range(count)]
    tenant_list = list(tenants)
    await conn.execute(
        "INSERT INTO pools (id, tenant_ids, runtime_class, runtime_instance_id, region) "
        "SELECT i, $2::text[], $3, 'rt-' || i, 'eu-west' FROM unnest($1::text[]) AS i",
        ids, tenant_list, runtime_class,
    )
    await conn.execute(
        "INSERT INTO ledgers (pool_id, cpu_total, memory_total, llm_total) "
        "SELECT i, $2, $3, $4 FROM unnest($1::text[]) AS i",
        ids, capacity[0], capacity[1], capacity[2],
    )
    if heartbeat_at is not None:
        await conn.execute(
            "INSERT INTO runtime_instances (id, last_heartbeat_at, first_seen_at) "
            "SELECT 'rt-' || i, $2, $2 FROM unnest($1::text[]) AS i "
            "ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = EXCLUDED.last_heartbeat_at",
            ids, heartbeat_at,
        )
    return ids


async def heartbeat_add(conn: Connection, instance_id: str, *, at: datetime = NOW) -> None:
    """Record that runtime ``instance_id`` heartbeated at ``at``."""
    await conn.execute(
        "INSERT INTO runtime_instances (id, last_heartbeat_at, first_seen_at) "
        "VALUES ($1, $2, $2) "
        "ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = EXCLUDED.last_heartbeat_at",
        instance_id, at,
    )


async def tasks_add(
    conn: Connection,
    *,
    tenant: str,
    count: int = 1,
    spec: Mapping[str, Any] | None = None,
    specs: Sequence[Mapping[str, Any]] | None = None,
    admitted_at: datetime = NOW,
) -> list[uuid.UUID]:
    """Insert admitted tasks of ``tenant`` in one statement; return their ids in order."""
    if specs is None:
        specs = [spec or spec_make()] * count
    ids = [uuid.uuid4() for _ in specs]
    await conn.execute(
        "INSERT INTO tasks (id, tenant_id, shard, priority, runtime_class, spec, labels, "
        "max_attempts, admitted_at, created_at, updated_at) "
        "SELECT x.id, $1, $2, x.priority, x.rc, x.spec, x.labels, x.max_attempts, $3, $3, $3 "
        "FROM unnest($4::uuid[], $5::int[], $6::text[], $7::jsonb[], $8::jsonb[], $9::int[]) "
        "WITH ORDINALITY AS x(id, priority, rc, spec, labels, max_attempts, n) ORDER BY x.n",
        tenant,
        shard_of(tenant),
        admitted_at,
        ids,
        [int(s.get("priority", 0)) for s in specs],
        [s["runtimeClass"] for s in specs],
        [dict(s) for s in specs],
        [dict(s.get("labels", {})) for s in specs],
        [int(s.get("maxAttempts", 3)) for s in specs],
    )
    return ids


def placement_on(pool_id: str) -> str:
    """Return the stored placement of a task placed on ``pool_id`` alone (no alternatives)."""
    return placement_stored(Candidate(pool_id, 0.0), members=[(pool_id, 1)], alternatives=())


async def task_get(conn: Connection, task_id: uuid.UUID) -> dict[str, Any]:
    """Return a task row as a dict."""
    row = await conn.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
    assert row is not None, f"no task {task_id}"
    task = dict(row)
    # The placement is stored as the text the reconciler wrote: rendered as the API serves
    # it, and the pools it walked past (stored, not served) as "walked_from".
    if task["placement"] is not None:
        task["walked_from"] = orjson.loads(task["placement"])[5]
        task["placement"] = placement_document(task["placement"])
    return task


async def task_states(db: Database) -> dict[str, int]:
    """Return how many tasks are in each state."""
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT state, count(*) FROM tasks GROUP BY state")
        return {r[0]: int(r[1]) for r in rows}


async def task_events(db: Database, task_id: uuid.UUID) -> list[tuple[str, Any]]:
    """Return the task's events as (reason, detail), oldest first."""
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT reason, detail FROM task_events WHERE task_id = $1 "
                                "ORDER BY id", task_id)
    return [(r[0], r[1]) for r in rows]


def reconcile_process(
    database_url: str, *args: str, stdout: int = subprocess.PIPE, **settings: object
) -> subprocess.Popen:
    """Start ``berth reconcile *args`` on the database, logging warnings only, with
    ``settings`` as ``BERTH_<NAME>`` variables (``batch_size=16``); stderr is a pipe."""
    env = {**os.environ, "BERTH_DATABASE_URL": database_url, "BERTH_LOG_LEVEL": "warning"}
    env.update({f"BERTH_{name.upper()}": str(value) for name, value in settings.items()})
    return subprocess.Popen([sys.executable, "-m", "app.cli", "reconcile", *args], env=env,
                            stdout=stdout, stderr=subprocess.PIPE)


def rival_clock(
    dsn: str, sql: str, *, on_read: int = 1, now: Callable[[], datetime] = lambda: NOW
) -> Callable[[], datetime]:
    """Return a clock (``now``'s times) that runs ``sql`` on a connection of its own, to its
    end, at its ``on_read``-th read: another writer between a pass's reads of the clock."""
    reads = []

    def clock() -> datetime:
        reads.append(True)
        if len(reads) == on_read:
            async def rival() -> None:
                conn = await asyncpg.connect(database_url_parse(dsn).dsn)
                try:
                    await conn.execute(sql)
                finally:
                    await conn.close()

            worker = threading.Thread(target=lambda: asyncio.run(rival()))
            worker.start()
            worker.join()
        return now()

    return clock


async def ledger_violations(db: Database) -> list[str]:
    """Return every broken ledger invariant (empty when the ledger is consistent).

    No pool over its totals; every pool's reserved equals the sum of its live reservations;
    reservations only for LEASED tasks and preemptors' holds; no reservation, lease or event
    of a missing task, none on a missing pool; every LEASED task has
    reservations and a live lease on each of its pools; no task with live leases unless
    LEASED; a revoking lease has a deadline and a preemptor; every ADMITTED task
    that was looked at carries a pending reason or is queued unparked; no two tasks share a
    seq.
    """
    checks = {
        "ledger over total": (
            "SELECT pool_id FROM ledgers WHERE cpu_reserved > cpu_total "
            "OR memory_reserved > memory_total OR llm_reserved > llm_total"
        ),
        "reserved != sum of reservations": (
            "SELECT l.pool_id FROM ledgers l LEFT JOIN (SELECT pool_id, SUM(cpu) c, "
            "SUM(memory) m, SUM(llm) s FROM reservations GROUP BY pool_id) r "
            "ON r.pool_id = l.pool_id WHERE l.cpu_reserved != COALESCE(r.c, 0) "
            "OR l.memory_reserved != COALESCE(r.m, 0) OR l.llm_reserved != COALESCE(r.s, 0)"
        ),
        # A preemptor, reclaimer or nominee waiting (ADMITTED, perhaps being scheduled) may
        # hold capacity.
        "reservation of a task not LEASED (nor a preemptor's, reclaimer's or nominee's hold)": (
            "SELECT r.task_id FROM reservations r JOIN tasks t ON t.id = r.task_id "
            "WHERE t.state != 'LEASED' AND NOT (t.state = 'ADMITTED' AND r.hold)"
        ),
        # A pool's reservations are read as its live leases' plus its holds (0010_pg).
        "reservation neither a hold nor a live lease's": (
            "SELECT r.task_id FROM reservations r WHERE NOT r.hold AND NOT EXISTS "
            "(SELECT 1 FROM leases l WHERE l.task_id = r.task_id AND l.pool_id = r.pool_id "
            "AND l.state IN ('ACTIVE', 'REVOKING'))"
        ),
        "hold of a task not ADMITTED": (
            "SELECT r.task_id FROM reservations r JOIN tasks t ON t.id = r.task_id "
            "WHERE r.hold AND t.state != 'ADMITTED'"
        ),
        # No foreign keys on these tables (docs/decisions/0007): the writers keep them valid.
        "reservation, lease or event of a task that does not exist": (
            "SELECT x.task_id FROM (SELECT task_id FROM reservations UNION ALL "
            "SELECT task_id FROM leases UNION ALL SELECT task_id FROM task_events) x "
            "WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = x.task_id)"
        ),
        "reservation or live lease on a pool that does not exist": (
            "SELECT x.pool_id FROM (SELECT pool_id FROM reservations UNION ALL "
            "SELECT pool_id FROM leases WHERE state IN ('ACTIVE', 'REVOKING')) x "
            "WHERE NOT EXISTS (SELECT 1 FROM pools p WHERE p.id = x.pool_id)"
        ),
        "revoking lease without a deadline or preemptor": (
            "SELECT id FROM leases WHERE state = 'REVOKING' "
            "AND (revoke_by IS NULL OR preempted_by IS NULL)"
        ),
        "LEASED task without reservation": (
            "SELECT t.id FROM tasks t WHERE t.state = 'LEASED' "
            "AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.task_id = t.id)"
        ),
        "LEASED task whose pools and active leases differ": (
            "SELECT t.id FROM tasks t WHERE t.state = 'LEASED' AND "
            "(SELECT array_agg(pool_id ORDER BY pool_id) FROM reservations r "
            "WHERE r.task_id = t.id) IS DISTINCT FROM (SELECT array_agg(pool_id ORDER BY "
            "pool_id) FROM leases l WHERE l.task_id = t.id "
            "AND l.state IN ('ACTIVE', 'REVOKING'))"
        ),
        "live lease of a task not LEASED": (
            "SELECT l.id FROM leases l JOIN tasks t ON t.id = l.task_id "
            "WHERE l.state IN ('ACTIVE', 'REVOKING') AND t.state != 'LEASED'"
        ),
        "parked task without pending reason": (
            "SELECT id FROM tasks WHERE state = 'ADMITTED' AND parked AND pending_reason IS NULL"
        ),
        # No unique index on seq (docs/decisions/0008): its identity keeps it unique.
        "two tasks with one seq": "SELECT seq FROM tasks GROUP BY seq HAVING count(*) > 1",
    }
    out = []
    async with db.connection() as conn:
        for name, sql in checks.items():
            rows = await conn.fetch(sql + " LIMIT 5")
            if rows:
                out.append(f"{name}: {[r[0] for r in rows]}")
    return out


async def sweep_and_pass(
    db: Database, rec: Reconciler, seconds: float, *, instances: Sequence[str] = ("rt-p0",)
) -> None:
    """At ``NOW`` + ``seconds``: the runtime ``instances`` heartbeat, the safety sweep makes
    every parked task claimable, one pass of ``rec`` (owning every shard slot) runs, and the
    ledger invariants hold after it."""
    now = NOW + timedelta(seconds=seconds)
    async with db.transaction() as conn:
        for instance in instances:
            await heartbeat_add(conn, instance, at=now)
        await tasks_unpark(conn, slots=range(SHARD_SLOTS), now=now)
    await rec.run_once(now=now)
    assert await ledger_violations(db) == []


@asynccontextmanager
async def berth_serving(database_url: str, **settings: str) -> AsyncIterator[str]:
    """Run ``berth serve`` (no reconciler, warnings only) on the database, with ``settings``
    as ``BERTH_<NAME>`` variables; yield its base URL once ``/readyz`` answers 200."""
    from tests.test_serve import berth_command, berth_env, port_free

    port = port_free()
    env = {f"BERTH_{name.upper()}": value for name, value in settings.items()}
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is measured
        [*berth_command(), "serve", "--port", str(port)],
        env=berth_env(BERTH_DATABASE_URL=database_url, BERTH_RECONCILER_ENABLED="false",
                      BERTH_LOG_LEVEL="warning", **env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, process.stdout.read() if process.stdout else ""
                assert time.monotonic() < deadline, "berth serve did not become ready"
                await asyncio.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def processes_stop(procs: list[subprocess.Popen]) -> None:
    """Ask ``procs`` to stop (SIGTERM) and wait for them; kill one still running after 30 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
