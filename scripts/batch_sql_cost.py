"""PostgreSQL cost of the task-batch statement of the tree on PYTHONPATH, per task.

On a fresh database of ``BERTH_DATABASE_URL``'s server (as ``berth bench api`` makes), one
connection runs the statement that stores a batch of 1,000 copies of the bench's spec
without keys (as ``POST /v1/task-batches`` would, cap 100,000): 10 unmeasured batches, then
``--batches`` measured ones (the backend's CPU per task), then a CHECKPOINT and ``--explained``
batches under ``EXPLAIN (ANALYZE, BUFFERS, WAL)``: the WAL records, full-page images and
bytes per task of the statement itself (the server's WAL position would count every other
database's writes too), from a checkpoint on. Prints the first of those plans and the
index sizes.

    cd TREE && BERTH_DATABASE_URL=postgresql://... PYTHONPATH=$PWD \\
        python /path/to/scripts/batch_sql_cost.py [--batches 40]

Works on trees before revision 0009_batch too (their statement takes an array of specs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

import psutil

SPEC = {
    "runtimeClass": "python-3.11",
    "requests": {"cpuMillis": 250, "memoryMiB": 256},
    "constraints": {"regions": ["eu-west-1", "eu-central-1"]},
    "labels": {"app": "bench"},
}


def _statement(spec_json: str, now: datetime) -> tuple[str, list[Any]]:
    from app.ledger import batches

    if hasattr(batches, "_INSERT_UNKEYED"):
        return batches._INSERT_UNKEYED, [
            "t", 3, now, 100_000, "\n".join([spec_json] * 1000), batches.uuid7_prefix(now)]
    return batches._INSERT, ["t", 3, now, 100_000, [spec_json] * 1000, [], []]


async def _run(url: str, n: int, explained: int) -> None:
    from app.db import Database
    from app.scheduling.spec import TaskSpec

    spec_json = TaskSpec.model_validate(SPEC).model_dump_json(by_alias=True)
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))

            async def batch(explain: str = "") -> list[Any]:
                sql, args = _statement(spec_json, datetime.now(UTC))
                return await conn.fetch(explain + sql, *args)

            for _ in range(10):
                await batch()
            cpu0 = sum(backend.cpu_times()[:2])
            for _ in range(n):
                await batch()
            cpu1 = sum(backend.cpu_times()[:2])
            await conn.execute("CHECKPOINT")
            plans = [[r[0] for r in await batch("EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) ")]
                     for _ in range(explained)]
            wal = {"records": 0, "fpi": 0, "bytes": 0}
            for plan in plans:
                top = next(line for line in plan if line.strip().startswith("WAL:"))
                for item in top.split()[1:]:
                    name, value = item.split("=")
                    wal[name] += int(value)
            print(json.dumps({
                "batches": n,
                "postgresCpuMsPerTask": round((cpu1 - cpu0) / n, 4),
                "walPerTask": {k: round(v / explained / 1000, 3) for k, v in wal.items()},
            }))
            print("\n".join(plans[0]))
            sizes = await conn.fetch(
                "SELECT indexrelname, pg_relation_size(indexrelid) / 8192 FROM "
                "pg_stat_user_indexes WHERE relname IN ('tasks', 'task_events') ORDER BY 1")
            print(json.dumps({"indexPages": {r[0]: r[1] for r in sizes}}))
    finally:
        await db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="measured batches (40)")
    parser.add_argument("--explained", type=int, default=10,
                        help="batches under EXPLAIN after the checkpoint (10)")
    args = parser.parse_args()
    server = os.environ.get("BERTH_DATABASE_URL")
    if not server:
        print("batch_sql_cost: set BERTH_DATABASE_URL to a PostgreSQL server", file=sys.stderr)
        return 2
    from app.bench.api import _fresh_database

    with _fresh_database(server) as (url, _):
        asyncio.run(_run(url, args.batches, args.explained))
    return 0


if __name__ == "__main__":
    sys.exit(main())
