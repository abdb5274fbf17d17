"""The naive baseline: one task per transaction, the chosen pool's ledger row locked, no batching.

This is what a first, straightforward scheduler on PostgreSQL looks like, and what the
reconciler's batching is measured against. Each worker process owns a static share of the
shards (as ``berth reconcile --shard i/R`` does) and repeats, one transaction per task:

1. take the oldest admitted task of one of its shards (``FOR UPDATE SKIP LOCKED``);
2. choose the first pool by id of the task's runtime class that the tenant may use, that is
   active, ready and heartbeating, that meets the task's regions, residency and pool
   selector, and has room — and lock its ledger row (``SELECT … FOR UPDATE``);
3. add the request to the ledger, insert the reservation and the lease, mark the task
   ``LEASED`` with a placement, append the event, and commit (durably).

A gang is placed whole on one pool; preferred affinity, cost and spread are ignored (a simple
query cannot rank). A task that fits nowhere is parked with a pending reason and skipped.
"""

from __future__ import annotations

import asyncio
import math
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from app.config import SHARD_SLOTS
from bench.database import bench_connect
from bench.workers import worker_serve, workers_run

__all__ = ["NaiveResult", "naive_run"]

_TASK = """
    SELECT id, tenant_id, spec::text AS spec FROM tasks
    WHERE shard = $1 AND state = 'ADMITTED' AND NOT parked
    ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED"""

_POOL = """
    SELECT l.pool_id, p.runtime_instance_id
    FROM pools p
    JOIN ledgers l ON l.pool_id = p.id
    JOIN runtime_instances ri ON ri.id = p.runtime_instance_id
    WHERE p.runtime_class = $1 AND $2 = ANY(p.tenant_ids) AND p.status = 'ACTIVE' AND p.ready
      AND ri.last_heartbeat_at > now() - make_interval(secs => $9)
      AND ($3::text[] IS NULL OR p.region = ANY($3::text[]))
      AND ($4::text IS NULL OR p.data_residency = $4)
      AND p.labels @> $5::jsonb
      AND l.cpu_reserved + $6 <= l.cpu_total
      AND l.memory_reserved + $7 <= l.memory_total
      AND l.llm_reserved + $8 <= l.llm_total
    ORDER BY p.id
    LIMIT 1
    FOR UPDATE OF l"""

_RESERVE = """
    UPDATE ledgers SET cpu_reserved = cpu_reserved + $2, memory_reserved = memory_reserved + $3,
                       llm_reserved = llm_reserved + $4, updated_at = now()
    WHERE pool_id = $1"""

_RESERVATION = """
    INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm)
    VALUES ($1, $2, $3, $4, $5, $6)"""

_LEASE = """
    INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, granted_at,
                        expires_at)
    VALUES ($1, $2, $3, $4, 1, 'ACTIVE', now(), now() + make_interval(secs => $5))"""

_LEASED = """
    UPDATE tasks SET state = 'LEASED', placement = $2::jsonb, pending_reason = NULL,
                     leased_at = now(), updated_at = now()
    WHERE id = $1"""

_EVENT = """
    INSERT INTO task_events (task_id, at, from_state, to_state, reason)
    VALUES ($1, now(), $2, $3, $4)"""

_PARK = """
    UPDATE tasks SET parked = true, pending_reason = $2::jsonb, updated_at = now()
    WHERE id = $1"""

_NO_POOL = orjson.dumps(
    {"code": "insufficient_cpu", "message": "no pool of the runtime class has room",
     "rejections": {}}
).decode()


@dataclass(frozen=True, slots=True)
class NaiveResult:
    """What the naive workers did: tasks placed, tasks parked, and the wall time."""

    placed: int
    parked: int
    seconds: float
    workers: int
    #: CPU the workers and all PostgreSQL processes used meanwhile.
    cpu_seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Return placements per second."""
        return self.placed / self.seconds if self.seconds > 0 else 0.0


async def _place_one(
    conn: Any, shard: int, *, freshness: float, lease_ttl: float
) -> str | None:
    """Place the oldest admitted task of ``shard`` in one transaction; return what happened."""
    async with conn.transaction():
        task = await conn.fetchrow(_TASK, shard)
        if task is None:
            return None
        spec = orjson.loads(task["spec"])
        req = spec["requests"]
        members = (spec.get("gang") or {}).get("members", 1)
        cons = spec.get("constraints") or {}
        cpu, mem, llm = (members * req.get(k, 0) for k in ("cpuMillis", "memoryMiB", "llmSlots"))
        pool = await conn.fetchrow(
            _POOL, spec["runtimeClass"], task["tenant_id"], cons.get("regions"),
            cons.get("dataResidency"), orjson.dumps(cons.get("poolSelector") or {}).decode(),
            cpu, mem, llm, freshness,
        )
        if pool is None:
            await conn.execute(_PARK, task["id"], _NO_POOL)
            await conn.execute(_EVENT, task["id"], "ADMITTED", "ADMITTED", "no_placement")
            return "parked"
        pool_id = pool["pool_id"]
        # Berth's stored placement format (version 2; app.scheduling.explain).
        placement = orjson.dumps((2, [pool_id], [0.0], [], [[pool_id, members]], [])).decode()
        await conn.execute(_RESERVE, pool_id, cpu, mem, llm)
        await conn.execute(_RESERVATION, task["id"], pool_id, members, cpu, mem, llm)
        await conn.execute(
            _LEASE, uuid.uuid4(), task["id"], pool_id, pool["runtime_instance_id"], lease_ttl
        )
        await conn.execute(_LEASED, task["id"], placement)
        await conn.execute(_EVENT, task["id"], "ADMITTED", "LEASED", "placed")
        return "placed"


async def _worker(
    url: str, slots: list[int], quota: int, *, freshness: float, lease_ttl: float
) -> dict[str, Any]:

    conn = await bench_connect(url)
    try:
        async def work() -> dict[str, Any]:
            placed = parked = 0
            live = list(slots)
            i = 0
            while live and placed < quota:
                shard = live[i % len(live)]
                outcome = await _place_one(conn, shard, freshness=freshness,
                                           lease_ttl=lease_ttl)
                if outcome is None:
                    live.remove(shard)
                    continue
                if outcome == "placed":
                    placed += 1
                else:
                    parked += 1
                i += 1
            return {"placed": placed, "parked": parked}

        return await worker_serve(work)
    finally:
        await conn.close()


def naive_run(
    url: str,
    database: str,
    *,
    workers: int,
    limit: int | None,
    freshness_seconds: float = 15.0,
    lease_ttl_seconds: float = 3600.0,
    slot_count: int = SHARD_SLOTS,
) -> NaiveResult:
    """Run ``workers`` naive worker processes until about ``limit`` tasks are placed.

    With ``limit=None`` the workers run until no admitted, unparked task is left; otherwise
    each places at most ``ceil(limit / workers)``.
    """
    quota = 2**62 if limit is None else math.ceil(limit / workers)
    argvs = [
        ["-m", "bench.naive", url,
         ",".join(str(s) for s in range(slot_count) if s % workers == i), str(quota),
         str(freshness_seconds), str(lease_ttl_seconds)]
        for i in range(workers)
    ]
    results, pg_cpu = workers_run(database, argvs)
    return NaiveResult(
        placed=sum(r["placed"] for r in results),
        parked=sum(r["parked"] for r in results),
        seconds=max(r["ended"] for r in results) - min(r["began"] for r in results),
        workers=workers,
        cpu_seconds=sum(r["cpu"] for r in results) + pg_cpu,
    )


if __name__ == "__main__":
    _url, _slots, _quota, _fresh, _ttl = sys.argv[1:6]
    asyncio.run(_worker(
        _url, [int(s) for s in _slots.split(",") if s], int(_quota),
        freshness=float(_fresh), lease_ttl=float(_ttl),
    ))
