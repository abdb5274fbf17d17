"""The raw-SQL ceiling: the least work a placement needs on Berth's schema, with no scheduler.

``berth bench e2e`` runs it in the same run, on the same server, on a fresh copy of the same
dataset, and reports its rate and CPU next to the reconcilers' (``fractionOfCeiling``). Each
of ``clients`` processes (default 4) repeats, one transaction per loop:

1. claim up to 64 admitted, unparked tasks in admission order with ``FOR UPDATE SKIP LOCKED``
   (their requests and gang size read out of the spec in the same statement);
2. choose each task's pool trivially, in Python, from the client's own view of free capacity:
   among the pools of the task's runtime class that list the task's tenant and have room
   for the whole task (a gang goes whole on one pool), the one with the most free CPU.
   Regions, residency, selectors, affinity, health, scoring: none of it;
3. lock the chosen ledger rows in pool-id order and add the amounts in ONE conditional
   multi-row ``UPDATE`` (``reserved + request <= total`` on every dimension); a pool whose
   row is not returned lost a race with another client: its tasks are left out of this
   batch (they stay admitted, unlocked at commit, and are claimed again), and the client
   re-reads its whole view of free capacity (one read of the ledgers) — the rest of the
   batch goes on;
4. insert the reservations (one row per task) and the leases (one per task) with one
   ``INSERT … SELECT unnest(…)`` each, mark the tasks ``LEASED`` with one ``UPDATE``, and
   commit (durably, as the server is configured).

No task events, no placement JSON, no pending reasons: a ceiling, not a scheduler.

**Why reservations are written.** A lease alone does not say how much capacity it holds, so
a ledger without reservation rows could never be released or checked. The bench's invariants
(:func:`app.bench.dataset.ledger_check`: every ledger equals the sum of its reservations,
every leased task has a reservation and an active lease on the same pool, gang members add
up) are the same for the reconcilers, the naive baseline and the ceiling, and they require
the rows. So the ceiling writes one row more per placement than the bare minimum (one ledger
update per pool touched, a reservation, a lease, a task update): it is a slightly *lower*
ceiling, which makes ``fractionOfCeiling`` slightly flattering, by about one insert per
placement. The schema's triggers, foreign keys and indexes are Berth's own: they are part of
what a placement costs on it.

A task that fits on no pool of its cell even after a fresh read is left admitted and skipped
(``unplaced``); the dataset's headroom makes that rare. The clients stop when a claim comes
back empty.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

from app.bench.naive import worker_serve, workers_run

__all__ = ["CEILING_BATCH", "CeilingResult", "ceiling_run"]

#: Tasks one client claims and places per transaction.
CEILING_BATCH = 64

_CLAIM = """
    SELECT id, tenant_id, runtime_class,
           coalesce((spec -> 'gang' ->> 'members')::int, 1) AS members,
           coalesce((spec -> 'requests' ->> 'cpuMillis')::bigint, 0) AS cpu,
           coalesce((spec -> 'requests' ->> 'memoryMiB')::bigint, 0) AS memory,
           coalesce((spec -> 'requests' ->> 'llmSlots')::bigint, 0) AS llm
    FROM tasks
    WHERE state = 'ADMITTED' AND NOT parked AND NOT (id = ANY($2::uuid[]))
    ORDER BY seq LIMIT $1
    FOR UPDATE SKIP LOCKED"""

_POOLS = """
    SELECT p.id, p.runtime_class, p.tenant_ids, p.runtime_instance_id,
           l.cpu_total - l.cpu_reserved, l.memory_total - l.memory_reserved,
           l.llm_total - l.llm_reserved
    FROM pools p JOIN ledgers l ON l.pool_id = p.id
    ORDER BY p.id"""

_FREE = """
    SELECT pool_id, cpu_total - cpu_reserved, memory_total - memory_reserved,
           llm_total - llm_reserved
    FROM ledgers WHERE pool_id = ANY($1::text[])"""

# Lock first, in pool-id order (a one-time filter, as app.ledger.reservations does), then one
# conditional update; RETURNING gives what is left, to keep the client's view current.
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
    RETURNING l.pool_id, l.cpu_total - l.cpu_reserved, l.memory_total - l.memory_reserved,
              l.llm_total - l.llm_reserved"""

_RESERVATIONS = """
    INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[], $4::bigint[], $5::bigint[],
                         $6::bigint[])"""

_LEASES = """
    INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, granted_at,
                        expires_at)
    SELECT gen_random_uuid(), t, p, r, 1, 'ACTIVE', now(), now() + make_interval(secs => $4)
    FROM unnest($1::uuid[], $2::text[], $3::text[]) AS x(t, p, r)"""

_LEASED = """
    UPDATE tasks SET state = 'LEASED', leased_at = now(), updated_at = now()
    WHERE id = ANY($1::uuid[])"""


@dataclass(frozen=True, slots=True)
class CeilingResult:
    """What the ceiling clients did: placements, their wall time and CPU (clients + server)."""

    placed: int
    unplaced: int
    conflicts: int
    seconds: float
    clients: int
    cpu_seconds: float

    @property
    def rate(self) -> float:
        """Return placements per second."""
        return self.placed / self.seconds if self.seconds > 0 else 0.0


class _View:
    """One client's idea of each pool's free capacity, grouped by (runtime class, tenant)."""

    def __init__(self, rows: list[Any]) -> None:
        self.free: dict[str, list[int]] = {}
        self.instance: dict[str, str] = {}
        self.cells: dict[tuple[str, str], list[str]] = {}
        for pool_id, rc, tenants, instance, cpu, memory, llm in rows:
            self.free[pool_id] = [cpu, memory, llm]
            self.instance[pool_id] = instance
            for tenant in tenants:
                self.cells.setdefault((rc, tenant), []).append(pool_id)

    def choose(self, rc: str, tenant: str, need: tuple[int, int, int]) -> str | None:
        """Return the pool of the cell with the most free CPU that has room for ``need``
        (and count it taken): with four clients' views slightly stale, the roomiest pool is
        the least likely to refuse."""
        best: list[int] | None = None
        best_id = None
        for pool_id in self.cells.get((rc, tenant), ()):
            free = self.free[pool_id]
            if (free[0] >= need[0] and free[1] >= need[1] and free[2] >= need[2]
                    and (best is None or free[0] > best[0])):
                best, best_id = free, pool_id
        if best is not None:
            best[0] -= need[0]
            best[1] -= need[1]
            best[2] -= need[2]
        return best_id

    def pools_of(self, rc: str, tenant: str) -> list[str]:
        """Return the pools of a cell."""
        return self.cells.get((rc, tenant), [])


async def _refresh(conn: Any, view: _View, pools: list[str]) -> None:
    for pool_id, cpu, memory, llm in await conn.fetch(_FREE, pools):
        view.free[pool_id] = [cpu, memory, llm]


async def _place_batch(
    conn: Any, view: _View, skip: list[Any], ttl: float
) -> tuple[int, int, int]:
    """Claim and place one batch; return (tasks claimed, tasks placed, pools that refused)."""
    async with conn.transaction():
        tasks = await conn.fetch(_CLAIM, CEILING_BATCH, skip)
        if not tasks:
            return 0, 0, 0
        chosen: list[tuple[Any, str, int, int, int, int]] = []
        amounts: dict[str, list[int]] = {}
        for task_id, tenant, rc, members, cpu, memory, llm in tasks:
            need = (members * cpu, members * memory, members * llm)
            pool_id = view.choose(rc, tenant, need)
            if pool_id is None:
                # Perhaps only the view is stale: read the cell afresh, try once more.
                await _refresh(conn, view, view.pools_of(rc, tenant))
                pool_id = view.choose(rc, tenant, need)
            if pool_id is None:
                skip.append(task_id)
                continue
            chosen.append((task_id, pool_id, members, *need))
            acc = amounts.setdefault(pool_id, [0, 0, 0])
            acc[0] += need[0]
            acc[1] += need[1]
            acc[2] += need[2]
        if not chosen:
            return len(tasks), 0, 0
        pools = sorted(amounts)
        rows = await conn.fetch(
            _RESERVE, pools, [amounts[p][0] for p in pools], [amounts[p][1] for p in pools],
            [amounts[p][2] for p in pools],
        )
        for pool_id, cpu, memory, llm in rows:
            view.free[pool_id] = [cpu, memory, llm]
        refused = set(pools) - {r[0] for r in rows}
        if refused:
            # Another client took the room: those tasks wait for the next claim. The view is
            # stale where the others placed: read every pool's free capacity afresh (one
            # read of the ledgers, no locks).
            await _refresh(conn, view, list(view.free))
            chosen = [c for c in chosen if c[1] not in refused]
        if not chosen:
            return len(tasks), 0, len(refused)
        ids = [c[0] for c in chosen]
        where = [c[1] for c in chosen]
        await conn.execute(
            _RESERVATIONS, ids, where, [c[2] for c in chosen], [c[3] for c in chosen],
            [c[4] for c in chosen], [c[5] for c in chosen],
        )
        await conn.execute(_LEASES, ids, where, [view.instance[p] for p in where], ttl)
        await conn.execute(_LEASED, ids)
        return len(tasks), len(chosen), len(refused)


async def _client(url: str, lease_ttl: float) -> dict[str, Any]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        view = _View(list(await conn.fetch(_POOLS)))

        async def work() -> dict[str, Any]:
            placed = conflicts = 0
            skip: list[Any] = []
            while True:
                claimed, done, refused = await _place_batch(conn, view, skip, lease_ttl)
                if not claimed:
                    break
                placed += done
                conflicts += refused
            return {"placed": placed, "unplaced": len(skip), "conflicts": conflicts}

        return await worker_serve(work)
    finally:
        await conn.close()


def ceiling_run(url: str, *, clients: int = 4, lease_ttl_seconds: float = 3600.0) -> CeilingResult:
    """Run ``clients`` ceiling client processes until no admitted task is left."""
    argvs = [["-m", "app.bench.ceiling", url, str(lease_ttl_seconds)]] * clients
    results, pg_cpu = workers_run(url, argvs)
    return CeilingResult(
        placed=sum(r["placed"] for r in results),
        unplaced=sum(r["unplaced"] for r in results),
        conflicts=sum(r["conflicts"] for r in results),
        seconds=max(r["ended"] for r in results) - min(r["began"] for r in results),
        clients=clients,
        cpu_seconds=sum(r["cpu"] for r in results) + pg_cpu,
    )


if __name__ == "__main__":
    asyncio.run(_client(sys.argv[1], float(sys.argv[2])))
