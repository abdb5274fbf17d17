"""``berth bench drivers``: client CPU of one statement through each way to the database.

The measurement behind docs/decisions/0004-one-database-path.md. On a scratch table of a
fresh database it runs the same one-row ``INSERT … RETURNING`` many times through:

- an asyncpg pool in autocommit (one round trip), and in an explicit transaction;
- SQLAlchemy's async engine (on asyncpg) with ``engine.begin()``, with and without
  ``pool_pre_ping``, and in AUTOCOMMIT.

and reports this process's CPU (user + system) per statement, which is what a Berth process
pays; the rounds alternate so that a noisy machine affects every way alike. Prints ONE JSON
line: ``{"cpuMsPerStatement": {way: [round1, round2, …]}, "statements": N, …}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

from app.bench.dataset import scratch_database
from app.bench.e2e import DEFAULT_SERVER
from app.db import async_url, plain_url

SQL = "INSERT INTO bench_driver (v) VALUES ($1) RETURNING id"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(url: str, *, statements: int, rounds: int) -> dict[str, list[float]]:
    conn = await asyncpg.connect(plain_url(url))
    await conn.execute("CREATE TABLE bench_driver (id bigserial PRIMARY KEY, v text)")
    await conn.close()
    pool = await asyncpg.create_pool(plain_url(url), min_size=1, max_size=4)
    ping = create_async_engine(async_url(url), pool_size=4, pool_pre_ping=True)
    plain = create_async_engine(async_url(url), pool_size=4, pool_pre_ping=False)
    auto = plain.execution_options(isolation_level="AUTOCOMMIT")

    async def asyncpg_autocommit() -> None:
        async with pool.acquire() as c:
            await c.fetch(SQL, "x")

    async def asyncpg_transaction() -> None:
        async with pool.acquire() as c, c.transaction():
            await c.fetch(SQL, "x")

    async def sqlalchemy_begin_pre_ping() -> None:
        async with ping.begin() as c:
            (await c.exec_driver_sql(SQL, ("x",))).all()

    async def sqlalchemy_begin() -> None:
        async with plain.begin() as c:
            (await c.exec_driver_sql(SQL, ("x",))).all()

    async def sqlalchemy_autocommit() -> None:
        async with auto.connect() as c:
            (await c.exec_driver_sql(SQL, ("x",))).all()

    ways: dict[str, Callable[[], Awaitable[None]]] = {
        "asyncpgAutocommit": asyncpg_autocommit,
        "asyncpgTransaction": asyncpg_transaction,
        "sqlalchemyBeginPrePing": sqlalchemy_begin_pre_ping,
        "sqlalchemyBegin": sqlalchemy_begin,
        "sqlalchemyAutocommit": sqlalchemy_autocommit,
    }
    out: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for way in ways.values():  # warm every pool and statement cache
            for _ in range(200):
                await way()
        for _ in range(rounds):
            for name, way in ways.items():
                started = _cpu()
                for _ in range(statements):
                    await way()
                out[name].append(round(1000 * (_cpu() - started) / statements, 4))
    finally:
        await pool.close()
        await ping.dispose()
        await plain.dispose()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the driver benchmark and print one JSON line."""
    p = argparse.ArgumentParser(
        prog="berth bench drivers",
        description="Measure the client CPU of one statement through each way to PostgreSQL "
        "(asyncpg pool, SQLAlchemy engine); prints one JSON line.",
    )
    p.add_argument("--server-url", default=os.environ.get("BERTH_DATABASE_URL") or DEFAULT_SERVER,
                   help="PostgreSQL server to create the scratch database on")
    p.add_argument("--statements", type=int, default=3000, help="statements per way per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    args = p.parse_args(argv)
    started = time.perf_counter()

    async def run() -> dict[str, list[float]]:
        async with scratch_database(args.server_url, prefix="berth_bench_drivers") as url:
            return await _measure(url, statements=args.statements, rounds=args.rounds)

    result = asyncio.run(run())
    print(json.dumps({
        "cpuMsPerStatement": result,
        "statements": args.statements,
        "rounds": args.rounds,
        "wallSeconds": round(time.perf_counter() - started, 2),
    }))
    return 0
