"""What a placement writes: deterministic per-placement counts of reconciler passes.

Run with the code under test first on the path, against a PRIVATE PostgreSQL cluster that
preloads pg_stat_statements (WAL is cluster-wide: nobody else may write to it meanwhile),
with ``pg_waldump`` able to read its ``pg_wal`` directory (``--waldir``)::

    PYTHONPATH=<checkout> python scripts/placement_writes.py \
        --server postgresql://postgres@127.0.0.1:5499/postgres \
        --pools 1000 --tasks 20000 [--finished 1000000] [--reconcilers 1]

Loads the `berth bench e2e` dataset, runs in-process reconcilers (all slots split between
them) until every task is leased, and prints one JSON line: per placement the WAL bytes and
records (pg_waldump --stats), statements and their rows (pg_stat_statements), tuples
inserted/updated/HOT-updated/deleted per table, index insertions, PostgreSQL backend CPU
(/proc of the reconcilers' backends) and the reconcilers' Python CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import time
from datetime import UTC, datetime

import asyncpg

from app.bench.dataset import (
    database_create,
    database_drop,
    dataset_admit,
    dataset_generate,
    dataset_load,
    runtimes_heartbeat,
)
from app.config import SHARD_SLOTS
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig

TABLES = ("tasks", "task_events", "reservations", "leases", "ledgers", "tenant_queue_counts")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _tables(conn) -> dict:
    rows = await conn.fetch(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
        "FROM pg_stat_user_tables WHERE relname = ANY($1::text[])", list(TABLES))
    return {r[0]: list(r[1:]) for r in rows}


async def _finished(url: str, n: int) -> None:
    """Insert ``n`` finished tasks (SUCCEEDED, with two events each) into the history."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, state, runtime_class, spec, "
            "admitted_at, leased_at, finished_at) SELECT gen_random_uuid(), "
            "'old-' || (g % 50), g % $2, 'SUCCEEDED', 'cpu', '{}', now(), now(), now() "
            "FROM generate_series(1, $1) g", n, SHARD_SLOTS)
        await conn.execute(
            "INSERT INTO task_events (task_id, at, from_state, to_state, reason) "
            "SELECT id, now(), 'LEASED', 'SUCCEEDED', 'lease_succeeded' FROM tasks "
            "WHERE state = 'SUCCEEDED'")
        await conn.execute("VACUUM ANALYZE tasks")
        await conn.execute("VACUUM ANALYZE task_events")
    finally:
        await conn.close()


def _wal_records(waldump: str, waldir: str, start: str, end: str) -> tuple[int, int]:
    """Return the WAL records between ``start`` and ``end`` and the index insertions among
    them (``pg_waldump --stats=record``)."""
    dump = subprocess.run(
        [waldump, "--stats=record", "-p", waldir, "-s", start, "-e", end],
        capture_output=True, text=True, check=False)
    if dump.returncode:
        raise SystemExit(dump.stderr)
    records, index_inserts = 0, 0
    for line in dump.stdout.splitlines():
        m = re.match(r"^(\S+/\S+)\s+(\d+)", line.strip())
        if m:
            name, count = m.group(1), int(m.group(2))
            records += count
            if name.startswith(("Btree/INSERT", "Gin/INSERT")):
                index_inserts += count
    return records, index_inserts


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default="postgresql://postgres@127.0.0.1:5499/postgres")
    ap.add_argument("--pools", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--reconcilers", type=int, default=1)
    ap.add_argument("--finished", type=int, default=0)
    ap.add_argument("--waldir", default="/tmp/h1pg/data/pg_wal")
    ap.add_argument("--waldump", default="/usr/lib/postgresql/15/bin/pg_waldump")
    args = ap.parse_args()

    now = datetime.now(UTC)
    url = await database_create(args.server)
    try:
        ds = dataset_generate(pools=args.pools, tasks=args.tasks, seed=1)
        await dataset_load(url, ds, now=now)
        if args.finished:
            await _finished(url, args.finished)
        await dataset_admit(url)
        admin = await asyncpg.connect(args.server)
        conn = await asyncpg.connect(url)
        await runtimes_heartbeat(conn)
        # Healthy for the whole run without heartbeats during it (they would add WAL).
        await conn.execute("UPDATE runtime_instances SET last_heartbeat_at = now() + "
                           "interval '1 hour'")
        await conn.execute("CHECKPOINT")
        db = Database(url, max_size=4)
        await db.open()
        size = SHARD_SLOTS // args.reconcilers
        recs = [
            Reconciler(db, ReconcilerConfig(batch_size=args.batch), owner_id=f"r{i}",
                       slots=frozenset(range(i * size, SHARD_SLOTS if i == args.reconcilers - 1
                                             else (i + 1) * size)))
            for i in range(args.reconcilers)
        ]
        # Warm the pool connections so their backends exist before we sample their CPU.
        async with db.connection() as c:
            await c.fetchval("SELECT 1")
        await asyncio.sleep(1.2)
        before_tables = await _tables(conn)
        await admin.execute("SELECT pg_stat_statements_reset()")
        lsn0 = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        pids = [r[0] for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")]
        cpu0 = {p: _cpu(p) for p in pids}
        py0 = time.process_time()
        wall0 = time.perf_counter()
        passes = 0
        while True:
            results = await asyncio.gather(*(r.run_once() for r in recs))
            passes += len(results)
            if not any(r.claimed for r in results):
                break
        wall = time.perf_counter() - wall0
        py = time.process_time() - py0
        pids_now = [r[0] for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")]
        pg_cpu = sum(_cpu(p) - cpu0.get(p, 0.0) for p in pids_now)
        lsn1 = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        wal = float(await conn.fetchval("SELECT $1::text::pg_lsn - $2::text::pg_lsn", lsn1, lsn0))
        stmts = await admin.fetch(
            "SELECT calls, rows, total_exec_time, query FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1 "
            "AND query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal%'",
            url.rsplit("/", 1)[1])
        await db.close()
        await asyncio.sleep(1.5)
        after_tables = await _tables(conn)
        leased = await conn.fetchval("SELECT count(*) FROM tasks WHERE state = 'LEASED'")
        await conn.close()
        await admin.close()
    finally:
        await database_drop(args.server, url)

    n = max(leased, 1)
    records, index_inserts = _wal_records(args.waldump, args.waldir, lsn0, lsn1)
    tables = {
        t: dict(zip(("ins", "upd", "hot", "del"),
                    (round((a - b) / n, 3) for a, b in zip(after_tables.get(t, [0] * 4),
                                                            before_tables.get(t, [0] * 4),
                                                            strict=True)), strict=True))
        for t in TABLES
    }
    calls = sum(s[0] for s in stmts if not s[3].startswith(("BEGIN", "COMMIT", "SAVEPOINT",
                                                               "RELEASE", "ROLLBACK")))
    top = sorted(stmts, key=lambda s: -s[2])[:8]
    print(json.dumps({
        "pools": args.pools, "tasks": args.tasks, "finished": args.finished,
        "reconcilers": args.reconcilers, "leased": leased, "passes": passes,
        "walBytesPerPlacement": round(wal / n, 1),
        "walRecordsPerPlacement": round(records / n, 2),
        "indexInsertsPerPlacement": round(index_inserts / n, 2),
        "statementsPerPass": round(calls / max(passes, 1), 1),
        "statementsPer1000Placements": round(1000 * calls / n, 1),
        "execMsPerPlacement": round(sum(s[2] for s in stmts) / n, 4),
        "pgCpuMsPerPlacement": round(1000 * pg_cpu / n, 4),
        "pyCpuMsPerPlacement": round(1000 * py / n, 4),
        "cpuMsPerPlacement": round(1000 * (pg_cpu + py) / n, 4),
        "wallSeconds": round(wall, 2),
        "tuplesPerPlacement": tables,
        "topStatements": [
            {"calls": s[0], "rows": s[1], "ms": round(s[2], 1), "sql": s[3][:160]} for s in top
        ],
    }))


if __name__ == "__main__":
    asyncio.run(main())
