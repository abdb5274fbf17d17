"""Where a reconciler's CPU goes per placement, step by step, and what the collector takes.

Run with the code under test first on the path (this tree or an older one)::

    PYTHONPATH=<checkout> python scripts/pass_costs.py \
        [--server postgresql://postgres@127.0.0.1:5432/postgres] [--pools 1000] [--tasks 20000]

Loads the `berth bench e2e` dataset into a fresh database, runs one in-process reconciler that
owns every slot until every task is leased, and prints the process CPU per placement, the
thread CPU spent in each step of a pass (the steps are wrapped where ``passes`` calls them;
an older tree lacking a step leaves it out), the cyclic collector's CPU and its collections
by generation (``gc.callbacks``), and the CPU of the database's backends per placement (from
/proc: PostgreSQL must run on this machine). The dataset is dropped before the passes run,
so the heap the collector walks is the reconciler's own. ``--auto-explain`` logs every
statement of the run with its duration and plan to the server's log (auto_explain, set for
the run's database only), for the statements' shares of the server's time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import time
from collections import Counter
from datetime import UTC, datetime

import asyncpg

import app.ledger.claims as claims
import app.reconciler.passes as passes
from app.bench import dataset as bench
from app.config import SHARD_SLOTS
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig

spent: Counter[str] = Counter()
collections: Counter[int] = Counter()
_gc_started: list[float] = []


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_started.append(time.thread_time())
    elif _gc_started:
        spent["gc"] += time.thread_time() - _gc_started.pop()
        collections[info["generation"]] += 1


def _wrap(module: object, name: str, key: str) -> None:
    """Count the thread CPU of ``module.name`` under ``key`` (if the tree has it)."""
    f = getattr(module, name, None)
    if f is None:
        return
    if asyncio.iscoroutinefunction(f):
        async def timed(*a, **k):
            t = time.thread_time()
            try:
                return await f(*a, **k)
            finally:
                spent[key] += time.thread_time() - t
    else:
        def timed(*a, **k):
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[key] += time.thread_time() - t
    setattr(module, name, timed)


def _wrap_compile() -> None:
    compile_ = passes.PassContext.compile

    def timed(self, task):
        t = time.thread_time()
        try:
            return compile_(self, task)
        finally:
            spent["compile"] += time.thread_time() - t

    passes.PassContext.compile = timed


async def _backends(conn: asyncpg.Connection) -> list[int]:
    """Return the process ids of the other backends of this connection's database."""
    return [r[0] for r in await conn.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()")]


def _server_cpu(pids: list[int]) -> dict[int, float]:
    """Return the CPU seconds each process of ``pids`` has used (PostgreSQL on this machine)."""
    total: dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _log_size(path: str) -> int:
    """Return the size of the server's log now (where this run's entries start)."""
    return os.path.getsize(path)


def _statement_times(path: str, start: int) -> dict[str, tuple[float, int]]:
    """Return the logged statements' total duration (ms) and runs by the start of their text,
    largest first, from the auto_explain entries written to ``path`` after ``start``."""
    with open(path, errors="replace") as f:
        f.seek(start)
        text = f.read()
    totals: dict[str, list] = {}
    for entry in re.split(r"\n(?=\S.*LOG:  duration:)", text):
        m = re.search(r"duration: ([0-9.]+) ms\s+plan:\s*\n\s*Query Text: (.{0,200})", entry)
        if m:
            key = " ".join(m.group(2).split())[:70]
            t = totals.setdefault(key, [0.0, 0])
            t[0] += float(m.group(1))
            t[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(totals.items(), key=lambda kv: -kv[1][0])}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--pools", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--auto-explain", action="store_true",
                    help="log every statement of the run with its duration and plan "
                         "(auto_explain, this database only) to the server's log, then print "
                         "each statement's total duration per placement")
    ap.add_argument("--server-log", default="/var/log/postgresql/postgresql-15-main.log",
                    help="the server's log file, read with --auto-explain")
    args = ap.parse_args()
    url = await bench.database_create(args.server)
    try:
        ds = bench.dataset_generate(pools=args.pools, tasks=args.tasks, seed=1)
        await bench.dataset_load(url, ds, now=datetime.now(UTC))
        await bench.dataset_admit(url)
        del ds
        conn = await asyncpg.connect(url)
        await bench.runtimes_heartbeat(conn)
        # Healthy for the whole run without heartbeats during it.
        await conn.execute(
            "UPDATE runtime_instances SET last_heartbeat_at = now() + interval '1 hour'")
        log_start = 0
        if args.auto_explain:
            log_start = _log_size(args.server_log)
            name = url.rsplit("/", 1)[1]
            await conn.execute(
                f"ALTER DATABASE {name} SET session_preload_libraries = 'auto_explain'")
            await conn.execute(f"ALTER DATABASE {name} SET auto_explain.log_min_duration = 0")
        db = Database(url, max_size=4)
        for name, key in (("select", "select"), ("select_ranked", "select"),
                          ("_grants", "placement documents"),
                          ("tasks_claim", "claim"), ("snapshot_read", "snapshot"),
                          ("plan_apply", "plan_apply"), ("_metrics_count", "metrics")):
            _wrap(passes, name, key)
        _wrap(claims, "_claimed", "claim rows")
        _wrap_compile()
        gc.callbacks.append(_on_gc)
        reconciler = Reconciler(db, ReconcilerConfig(batch_size=args.batch), owner_id="r",
                                slots=frozenset(range(SHARD_SLOTS)))
        t0 = time.process_time()
        server0 = _server_cpu(await _backends(conn))  # the pool's connections open lazily
        leased = 0
        while (result := await reconciler.run_once()).claimed:
            leased += result.leased
        total = time.process_time() - t0
        server_end = _server_cpu(await _backends(conn))
        server = sum(v - server0.get(pid, 0.0) for pid, v in server_end.items())
        gc.callbacks.remove(_on_gc)
        await db.close()
        await conn.close()
        n = max(leased, 1)
        print(f"placements {leased}: {total / n * 1e6:.1f} us process CPU per placement")
        print(f"server: {server / n * 1e6:.1f} us CPU per placement (the database's backends)")
        print(f"collections by generation {dict(sorted(collections.items()))}")
        for key, seconds in spent.most_common():
            print(f"  {key:20s} {seconds / n * 1e6:7.1f} us per placement")
        if args.auto_explain:
            print("statements (auto_explain durations, the server's wall time):")
            for text, (ms, calls) in _statement_times(args.server_log, log_start).items():
                print(f"  {ms * 1e3 / n:7.1f} us per placement {calls:5d} runs  {text}")
    finally:
        await bench.database_drop(args.server, url)


if __name__ == "__main__":
    asyncio.run(main())
