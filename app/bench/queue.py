"""``berth bench queue``: the cost of getTask's queue position and ETA on a deep queue.

Creates a fresh database, admits ``--tasks`` waiting tasks of one runtime class from
``--tenants`` tenants (a third of them parked for capacity on named pools, so the ETA reads
run too), then times ``task_get`` on the newest task (the worst case: every other task is
ahead of it) with and without the queue document, under each policy, ``--reads`` times, and
prints ONE JSON line of median and p99 milliseconds. The reads bound their counts at
``queue_count_limit`` (default 10,000); ``--limit`` changes it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

import orjson

from app.auth import Principal
from app.bench.dataset import database_create, database_drop
from app.bench.e2e import DEFAULT_SERVER
from app.config import Settings
from app.db import Database
from app.services.queue import QueueCache
from app.services.tasks import task_get
from app.shards import shard_of

__all__ = ["main", "queue_run"]


async def _load(db: Database, tasks: int, tenants: int) -> list[Any]:
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO pools (id, tenant_ids, runtime_class, runtime_instance_id, region) "
            "SELECT 'pool-' || i, (SELECT array_agg('t' || j) FROM generate_series(0, $1 - 1) j),"
            " 'standard', 'rt-' || i, 'eu' FROM generate_series(0, 9) i", tenants)
        await conn.execute(
            "INSERT INTO ledgers (pool_id, cpu_total, memory_total, llm_total, cpu_reserved) "
            "SELECT id, 4000, 8192, 0, 4000 FROM pools")
        spec = orjson.dumps({"runtimeClass": "standard",
                             "requests": {"cpuMillis": 1000}}).decode()
        for j in range(tenants):
            tenant = f"t{j}"
            await conn.execute(
                "INSERT INTO tasks (id, tenant_id, shard, priority, runtime_class, spec, "
                "pending_reason, pending_stage, parked, wake, admitted_at) "
                "SELECT gen_random_uuid(), $1, $2, i % 5, 'standard', $3::jsonb, "
                "CASE WHEN i % 3 = 0 THEN '{\"code\": \"insufficient_cpu\", \"message\": \"m\"}'"
                "::jsonb END, CASE WHEN i % 3 = 0 THEN 4 END, i % 3 = 0, "
                "CASE WHEN i % 3 = 0 THEN ARRAY['class:standard', 'pool:pool-1', "
                "'pool:pool-2'] END, now() - make_interval(secs => ($4 - i)) "
                "FROM generate_series(1, $4) i", tenant, shard_of(tenant), spec,
                tasks // tenants)
        await conn.execute("ANALYZE tasks")
    async with db.connection() as conn:  # as autovacuum would: the visibility map is set
        await conn.execute("VACUUM tasks")
    async with db.connection() as conn:
        return list(await conn.fetch(
            "SELECT id, tenant_id FROM tasks WHERE parked ORDER BY seq DESC LIMIT 1"))


async def _time(db: Database, row: Any, settings: Settings | None, reads: int,
                cache: QueueCache | None = None) -> dict:
    principal = Principal(role="tenant", subject="bench", tenant_ids=frozenset({row[1]}),
                          runtime_instance_ids=frozenset())
    samples = []
    queue = None
    for _ in range(reads):
        t0 = time.perf_counter()
        _, queue = await task_get(db, principal=principal, tenant=None, task_id=row[0],
                                  settings=settings, queue_cache=cache)
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {
        "medianMs": round(statistics.median(samples), 2),
        "p99Ms": round(samples[int(0.99 * (len(samples) - 1))], 2),
        "position": None if queue is None else queue["position"],
        "exact": None if queue is None else queue["exact"],
    }


async def queue_run(server_url: str, *, tasks: int, tenants: int, reads: int,
                    limit: int | None) -> dict[str, Any]:
    """Run the benchmark; return its JSON result."""
    url = await database_create(server_url)
    db = Database(url, max_size=2)
    try:
        (row,) = await _load(db, tasks, tenants)
        extra = {} if limit is None else {"queue_count_limit": limit}
        out: dict[str, Any] = {"tasks": tasks, "tenants": tenants, "reads": reads,
                               "limit": limit or Settings().queue_count_limit,
                               "withoutQueue": await _time(db, row, None, reads)}
        for policy in ("fifo", "priority", "fair"):
            settings = Settings(database_url=url, policy=policy, **extra)
            # As the API runs it (the class queue read at most once a second), and with the
            # class queue read on every call (the cost of the once-a-second refresh).
            out[policy] = await _time(db, row, settings, reads, QueueCache(1.0))
            out[f"{policy}Uncached"] = await _time(db, row, settings, max(reads // 10, 1),
                                                   QueueCache(0.0))
        return out
    finally:
        await db.close()
        await database_drop(server_url, url)


def main(argv: list[str]) -> int:
    """Run ``berth bench queue`` with ``argv`` and print one JSON line."""
    p = argparse.ArgumentParser(prog="berth bench queue",
                                description="Time getTask's queue position on a deep queue.")
    p.add_argument("--tasks", type=int, default=100000, help="waiting tasks (default 100000)")
    p.add_argument("--tenants", type=int, default=10, help="tenants (default 10)")
    p.add_argument("--reads", type=int, default=200, help="reads per policy (default 200)")
    p.add_argument("--limit", type=int, help="queue_count_limit (default: the setting's)")
    p.add_argument("--server-url", default=os.environ.get("BERTH_DATABASE_URL") or DEFAULT_SERVER)
    args = p.parse_args(argv)
    if args.tasks < 1 or args.tenants < 1 or args.reads < 1:
        print("berth bench queue: --tasks, --tenants and --reads must be positive",
              file=sys.stderr)
        return 2
    result = asyncio.run(queue_run(args.server_url, tasks=args.tasks, tenants=args.tenants,
                                   reads=args.reads, limit=args.limit))
    print(orjson.dumps(result).decode(), flush=True)
    return 0
