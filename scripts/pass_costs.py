"""Where a reconciler's CPU goes per placement, step by step, and what the collector takes.

Run with the code under test first on the path (this tree or an older one)::

    PYTHONPATH=<checkout> python scripts/pass_costs.py \
        [--server postgresql://postgres@127.0.0.1:5432/postgres] [--pools 1000] [--tasks 20000]

Loads the `berth bench e2e` dataset into a fresh database, runs one in-process reconciler that
owns every slot until every task is leased, and prints the process CPU per placement, the
thread CPU spent in each step of a pass (the steps are wrapped where ``passes`` calls them;
an older tree lacking a step leaves it out), the cyclic collector's CPU and its collections
by generation (``gc.callbacks``). The dataset is dropped before the passes run, so the heap
the collector walks is the reconciler's own.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--pools", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=1024)
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
        leased = 0
        while (result := await reconciler.run_once()).claimed:
            leased += result.leased
        total = time.process_time() - t0
        gc.callbacks.remove(_on_gc)
        await db.close()
        await conn.close()
        n = max(leased, 1)
        print(f"placements {leased}: {total / n * 1e6:.1f} us process CPU per placement")
        print(f"collections by generation {dict(sorted(collections.items()))}")
        for key, seconds in spent.most_common():
            print(f"  {key:20s} {seconds / n * 1e6:7.1f} us per placement")
    finally:
        await bench.database_drop(args.server, url)


if __name__ == "__main__":
    asyncio.run(main())
