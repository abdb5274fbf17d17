"""Retries: real transient PostgreSQL errors are recognized; backoff is bounded and jittered."""

from __future__ import annotations

import asyncpg
import pytest

from app.db import Database
from app.reconciler.retry import backoff_delay, transient_kind, transient_retry
from tests.factories import pool_add


async def _serialization_failure(db: Database) -> asyncpg.PostgresError:
    """Provoke a real 40001: two repeatable-read writers of one ledger row."""
    async with db.connection() as one, db.connection() as two:
        tx = one.transaction(isolation="repeatable_read")
        await tx.start()
        await one.fetchval("SELECT cpu_reserved FROM ledgers WHERE pool_id = 'p1'")
        await two.execute("UPDATE ledgers SET cpu_reserved = 1 WHERE pool_id = 'p1'")
        with pytest.raises(asyncpg.PostgresError) as caught:
            await one.execute("UPDATE ledgers SET cpu_reserved = 2 WHERE pool_id = 'p1'")
        await tx.rollback()
    return caught.value


async def test_transient_kinds_of_real_errors(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"])
    assert transient_kind(await _serialization_failure(db)) == "serialization"

    async with db.connection() as conn:
        with pytest.raises(asyncpg.IntegrityConstraintViolationError) as caught:
            await conn.execute("UPDATE ledgers SET cpu_reserved = cpu_total + 1")
    assert transient_kind(caught.value) is None  # a CHECK violation is a bug, not bad luck

    victim = await db.connect()
    try:
        async with db.connection() as killer:
            pid = await victim.fetchval("SELECT pg_backend_pid()")
            await killer.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)  # waits
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)) as caught:
            await victim.fetchval("SELECT 1")
        assert transient_kind(caught.value) == "connection"
        with pytest.raises(asyncpg.InterfaceError) as closed:  # and once asyncpg knows it
            await victim.fetchval("SELECT 1")
        assert transient_kind(closed.value) == "connection"
    finally:
        victim.terminate()
    assert transient_kind(ValueError("no")) is None


def test_backoff_doubles_under_a_cap_with_full_jitter() -> None:
    delays = [backoff_delay(a, base_seconds=0.1, max_seconds=0.5, rng=lambda: 1.0)
              for a in range(1, 6)]
    assert delays == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff_delay(3, base_seconds=0.1, max_seconds=0.5, rng=lambda: 0.25) == 0.1


async def test_retry_runs_again_after_a_real_serialization_failure(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"])
    failure = await _serialization_failure(db)
    calls: list[int] = []
    slept: list[float] = []

    async def operation() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise failure
        return "done"

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    out = await transient_retry(operation, attempts=5, base_seconds=0.02, rng=lambda: 0.5,
                                sleep=sleep)
    assert out == "done" and len(calls) == 3
    assert slept == [0.01, 0.02]


async def test_retry_gives_up_after_the_bound_and_never_retries_other_errors() -> None:
    class Deadlock(Exception):
        sqlstate = "40P01"

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def deadlock() -> None:
        raise Deadlock()

    with pytest.raises(Deadlock):
        await transient_retry(deadlock, attempts=3, base_seconds=1.0, rng=lambda: 1.0,
                              sleep=sleep)
    assert slept == [1.0, 2.0]

    async def broken() -> None:
        raise KeyError("bug")

    slept.clear()
    with pytest.raises(KeyError):
        await transient_retry(broken, attempts=3, base_seconds=1.0, sleep=sleep)
    assert slept == []
