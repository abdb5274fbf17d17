"""Capture one steady-state reconciler pass as SQL, to replay it under callgrind.

Run against a PRIVATE PostgreSQL cluster (its data directory is then read by a single-user
backend, so nothing else may use it)::

    PYTHONPATH=<checkout> python scripts/pass_capture.py SERVER_URL OUTDIR [POOLS TASKS]

Loads the `berth bench e2e` dataset at head, runs one pass (its snapshot is then cached),
copies the database to ``<name>_b`` (the state just before the next pass), runs the second
pass recording every statement it sends with its arguments, and writes
``OUTDIR/replay.sql`` (``PREPARE``/``EXECUTE`` lines, one statement a line, for
``postgres --single``) and ``OUTDIR/replay.json`` (the copy's name). Replay it with
``scripts/pass_callgrind.sh OUTDIR DATADIR PORT``: the instruction count is the same within
0.3 % between runs, so a variant (a changed statement in replay.sql, a schema change in
``OUTDIR/pre.sql``) can be compared with the pass it was captured from.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
from datetime import UTC

import asyncpg

from app.bench.dataset import (
    database_create,
    database_name,
    dataset_admit,
    dataset_generate,
    dataset_load,
    runtimes_heartbeat,
)
from app.config import SHARD_SLOTS
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig

captured: list[tuple[str, tuple]] = []
capturing = False


def _record() -> None:
    """Wrap asyncpg's query methods so that, while ``capturing``, each call is recorded."""
    cls = asyncpg.connection.Connection
    for name in ("fetch", "execute", "fetchval", "fetchrow"):
        def wrap(orig=getattr(cls, name)):  # type: ignore[no-untyped-def]
            async def call(self, query, *args, **kw):  # type: ignore[no-untyped-def]
                if capturing:
                    captured.append((query, args))
                return await orig(self, query, *args, **kw)
            return call
        setattr(cls, name, wrap())


def _element(v: object) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "t" if v else "f"
    s = v.isoformat() if isinstance(v, datetime.datetime) else str(v)
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _literal(v: object) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        s = "{" + ",".join(_element(x) for x in v) + "}"
    elif isinstance(v, datetime.datetime):
        s = v.isoformat()
    else:
        s = str(v)
    return "'" + s.replace("'", "''") + "'"


async def capture(server: str, pools: int, tasks: int) -> tuple[list[str], dict]:
    """Return the second pass's replay lines and what to know about it."""
    global capturing
    _record()
    url = await database_create(server)
    await dataset_load(url, dataset_generate(pools=pools, tasks=tasks, seed=1),
                       now=datetime.datetime.now(UTC))
    await dataset_admit(url)
    conn = await asyncpg.connect(url)
    await runtimes_heartbeat(conn)
    await conn.execute("UPDATE runtime_instances SET last_heartbeat_at = now() + "
                       "interval '1 day'")
    await conn.execute("VACUUM ANALYZE")
    await conn.close()
    rec = None
    for step in ("first", "second"):
        db = Database(url, max_size=2)
        await db.open()
        if rec is None:
            rec = Reconciler(db, ReconcilerConfig(batch_size=1024), owner_id="r0",
                             slots=frozenset(range(SHARD_SLOTS)))
        else:
            rec.db = db
        capturing = step == "second"
        result = await rec.run_once()
        capturing = False
        await db.close()
        if step == "first":
            admin = await asyncpg.connect(server)
            name = database_name(url)
            await admin.execute(f'CREATE DATABASE "{name}_b" TEMPLATE "{name}"')
            await admin.close()
    lines, n = [], 0
    for query, args in captured:
        text = " ".join(query.split())
        if args:
            n += 1
            lines.append(f"PREPARE s{n} AS {text}")
            lines.append(f"EXECUTE s{n}(" + ", ".join(_literal(a) for a in args) + ")")
        else:
            lines.append(text)
    return lines, {"db": database_name(url) + "_b", "claimed": result.claimed,
                   "leased": result.leased}


def main() -> None:
    server, out = sys.argv[1], sys.argv[2]
    pools = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    tasks = int(sys.argv[4]) if len(sys.argv) > 4 else 20000
    lines, info = asyncio.run(capture(server, pools, tasks))
    with open(f"{out}/replay.sql", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(f"{out}/replay.json", "w") as f:
        json.dump(info, f)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
