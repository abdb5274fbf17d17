"""The SQL floor: the least database work a placement needs on Berth's schema.

``berth bench e2e`` runs it in the same run, on the same server, on a fresh copy of the same
dataset, and reports ``fractionOfFloor`` = Berth's placements/s over the floor's. The floor
has no scheduler at all: every task's pool is decided before the clock starts (the dataset's
*anchor* pool, which has room for it by construction), and the clients only write. Each of
``clients`` asyncpg connections (default 4, in one process) repeats, one transaction per
loop, until a claim comes back empty:

1. claim up to ``batch`` (default 64) admitted, unparked tasks in admission order with
   ``FOR UPDATE SKIP LOCKED``, joined to their precomputed pool and amounts;
2. add the amounts to the ledgers in ONE conditional multi-row ``UPDATE``, its rows locked
   in pool-id order first (``reserved + request <= total`` on every dimension);
3. in one statement, insert a reservation and an active lease per task and mark the tasks
   ``LEASED``; commit (durably, as the server is configured).

**Why Berth cannot beat its CPU per placement.** Per task the floor writes a subset of the
rows a reconciler pass writes (Berth also appends a task event and stores the placement),
each transaction makes one sorted ledger update as a pass does, and nothing is decided: the
clients spend a few hundred microseconds of CPU per transaction. Berth's placement adds the
decision to the same writes. ``berth bench e2e`` reports both sides' row writes per
placement (``rowWritesPerPlacement``, from ``pg_stat_user_tables``), and ``tests/bench``
checks the subset on every run. Berth claims more tasks per pass (1,024 by default) than the
floor per transaction (64), which saves it commits: that is the one thing Berth does more
cheaply, and it lets Berth's rate come near the floor's, or pass it, while each of its
placements still costs more CPU (docs/benchmarks.md). On a loaded machine rates jitter; each
side's CPU per placement, also reported, much less.

A pool whose ledger row is not returned by the update (impossible with anchors unless the
schema's ledgers changed meanwhile) leaves its tasks admitted: they are counted
``unplaced`` and skipped.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bench.database import bench_connect
from bench.dataset import Dataset
from bench.workers import worker_serve, workers_run

__all__ = [
    "FLOOR_BATCH",
    "FloorResult",
    "FloorStatements",
    "floor_anchors",
    "floor_clients_serve",
    "floor_prepare",
    "floor_run",
    "floor_workers_run",
]

#: Tasks one client claims and places per transaction.
FLOOR_BATCH = 64
#: The table of each task's precomputed pool and amounts (not part of Berth's schema).
CHOICES = "bench_floor_choice"

_CLAIM = f"""
    SELECT t.id, c.pool_id, c.instance, c.members, c.cpu, c.memory, c.llm
    FROM tasks t JOIN {CHOICES} c ON c.task_id = t.id
    WHERE t.state = 'ADMITTED' AND NOT t.parked AND NOT (t.id = ANY($2::uuid[]))
    ORDER BY t.seq LIMIT $1
    FOR UPDATE OF t SKIP LOCKED"""

_RESERVE = """
    WITH v AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[])
               AS v(pool_id, cpu, memory, llm)),
         locked AS (SELECT l.pool_id FROM ledgers l JOIN v ON v.pool_id = l.pool_id
                    ORDER BY l.pool_id FOR UPDATE OF l)
    UPDATE ledgers l SET cpu_reserved = l.cpu_reserved + v.cpu,
                         memory_reserved = l.memory_reserved + v.memory,
                         llm_reserved = l.llm_reserved + v.llm, updated_at = now()
    FROM v
    WHERE v.pool_id = l.pool_id AND (SELECT count(*) FROM locked) > 0
      AND l.cpu_reserved + v.cpu <= l.cpu_total
      AND l.memory_reserved + v.memory <= l.memory_total
      AND l.llm_reserved + v.llm <= l.llm_total
    RETURNING l.pool_id"""

_LEASE = """
    WITH x AS (SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::bigint[],
                                    $6::bigint[], $7::bigint[])
               AS x(task_id, pool_id, instance, members, cpu, memory, llm)),
         r AS (INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm)
               SELECT task_id, pool_id, members, cpu, memory, llm FROM x),
         l AS (INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state,
                                   granted_at, expires_at)
               SELECT gen_random_uuid(), task_id, pool_id, instance, 1, 'ACTIVE', now(),
                      now() + make_interval(secs => $8)
               FROM x)
    UPDATE tasks SET state = 'LEASED', leased_at = now(), updated_at = now()
    WHERE id = ANY($1::uuid[])"""


@dataclass(frozen=True, slots=True)
class FloorResult:
    """What the floor's clients did: placements, their wall time and CPU (client + server)."""

    placed: int
    unplaced: int
    seconds: float
    clients: int
    batch: int
    cpu_seconds: float

    @property
    def rate(self) -> float:
        """Return placements per second."""
        return self.placed / self.seconds if self.seconds > 0 else 0.0


def floor_anchors(ds: Dataset) -> list[tuple[str, int, int, int, int]]:
    """Return each task's anchor pool and amounts (members times its requests), in admission
    order: (pool id, members, cpu, memory, llm)."""
    out = []
    for task, pool_id in zip(ds.tasks, ds.anchors, strict=True):
        spec = orjson.loads(task[6])
        members = (spec.get("gang") or {}).get("members", 1)
        req = spec["requests"]
        out.append((pool_id, members, members * req["cpuMillis"], members * req["memoryMiB"],
                    members * req["llmSlots"]))
    return out


async def floor_prepare(url: str, ds: Dataset) -> None:
    """Store each task's anchor pool and amounts in the floor's own table (before the clock)."""
    rows = [(task[1], pool_id, f"rt-{pool_id}", members, cpu, memory, llm)
            for task, (pool_id, members, cpu, memory, llm)
            in zip(ds.tasks, floor_anchors(ds), strict=True)]
    conn = await bench_connect(url)
    try:
        await conn.execute(
            f"""CREATE TABLE {CHOICES} (task_id uuid PRIMARY KEY, pool_id text, instance text,
                                        members int, cpu bigint, memory bigint, llm bigint)""")
        await conn.copy_records_to_table(CHOICES, records=rows)
        await conn.execute(f"ANALYZE {CHOICES}")
    finally:
        await conn.close()


def _lease_args(placed: list[Any]) -> list[Any]:
    """Return the lease statement's columns of the placed tasks (its arguments but the last)."""
    return list(zip(*placed, strict=True))


async def _place_batch(conn: Any, floor: FloorStatements, batch: int, skip: list[Any],
                       ttl: float) -> tuple[int, int]:
    """Claim and place one batch with ``floor``'s statements; return (tasks claimed, tasks
    placed), the tasks it could not place appended to ``skip``."""
    async with conn.transaction():
        tasks = await conn.fetch(floor.claim, batch, skip)
        if not tasks:
            return 0, 0
        placed = await floor_reserved(conn, floor.reserve, tasks, skip)
        if placed:
            await conn.execute(floor.lease, *floor.lease_args(placed), ttl)
        return len(tasks), len(placed)


async def floor_reserved(
    conn: Any, statement: str, tasks: Sequence[Any], skip: list[Any]
) -> list[Any]:
    """Add the amounts of the claimed ``tasks`` (rows of id, pool, ..., cpu, memory, llm) to
    their pools' ledgers with ``statement`` (one conditional multi-row update, pools in
    order, returning the pools it updated); return the tasks whose pool took them, and
    append the others' ids to ``skip``."""
    amounts: dict[Any, list[int]] = {}
    for t in tasks:
        acc = amounts.setdefault(t[1], [0, 0, 0])
        acc[0] += t[-3]
        acc[1] += t[-2]
        acc[2] += t[-1]
    pools = sorted(amounts)
    granted = {r[0] for r in await conn.fetch(
        statement, pools, [amounts[p][0] for p in pools], [amounts[p][1] for p in pools],
        [amounts[p][2] for p in pools],
    )}
    skip.extend(t[0] for t in tasks if t[1] not in granted)
    return [t for t in tasks if t[1] in granted]


@dataclass(frozen=True)
class FloorStatements:
    """One floor's transaction: ``claim`` ($1 the batch, $2 the ids to skip) returns rows of
    id, pool, ..., cpu, memory, llm; ``reserve`` adds their amounts (:func:`floor_reserved`);
    ``lease`` takes ``lease_args`` of the placed rows, then the lease's seconds."""

    claim: str
    reserve: str
    lease: str
    lease_args: Callable[[list[Any]], Sequence[Any]]


async def floor_clients_serve(url: str, clients: int, batch: int, lease_ttl: float,
                              floor: FloorStatements) -> None:
    """Serve one floor worker (:func:`bench.workers.worker_serve`): ``clients`` connections
    each claim and place batches with ``floor``'s statements until a claim comes back
    empty."""
    conns = [await bench_connect(url) for _ in range(clients)]
    try:
        async def one(conn: Any) -> tuple[int, int]:
            placed = 0
            skip: list[Any] = []
            while True:
                claimed, done = await _place_batch(conn, floor, batch, skip, lease_ttl)
                if not claimed:
                    return placed, len(skip)
                placed += done

        async def work() -> dict[str, Any]:
            done = await asyncio.gather(*(one(c) for c in conns))
            return {"placed": sum(d[0] for d in done), "unplaced": sum(d[1] for d in done)}

        await worker_serve(work)
    finally:
        for conn in conns:
            await conn.close()


def floor_workers_run(
    module: str, url: str, database: str, *, clients: int, batch: int,
    lease_ttl_seconds: float,
) -> FloorResult:
    """Run the floor of ``module`` (``python -m module``, serving
    :func:`floor_clients_serve`) with ``clients`` connections in one worker process until
    no task is left to claim."""
    argv = ["-m", module, url, str(clients), str(batch), str(lease_ttl_seconds)]
    (result,), pg_cpu = workers_run(database, [argv])
    return FloorResult(
        placed=result["placed"], unplaced=result["unplaced"],
        seconds=result["ended"] - result["began"], clients=clients, batch=batch,
        cpu_seconds=result["cpu"] + pg_cpu,
    )


def floor_run(
    url: str, database: str, *, clients: int = 4, batch: int = FLOOR_BATCH,
    lease_ttl_seconds: float = 3600.0,
) -> FloorResult:
    """Run the floor's ``clients`` connections (one worker process) until no admitted task is
    left."""
    return floor_workers_run("bench.floor", url, database, clients=clients, batch=batch,
                             lease_ttl_seconds=lease_ttl_seconds)


if __name__ == "__main__":
    asyncio.run(floor_clients_serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                    float(sys.argv[4]),
                                    FloorStatements(_CLAIM, _RESERVE, _LEASE, _lease_args)))
