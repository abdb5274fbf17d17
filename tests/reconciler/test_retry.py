"""Retries: real transient PostgreSQL errors are recognized; backoff is bounded and jittered."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.reconciler.retry import backoff_delay, transient_kind, transient_retry
from tests.factories import pool_add


async def _serialization_failure(db: AsyncEngine) -> DBAPIError:
    """Provoke a real 40001: two repeatable-read writers of one ledger row."""
    async with db.connect() as one, db.connect() as two:
        await one.execution_options(isolation_level="REPEATABLE READ")
        await one.execute(text("SELECT cpu_reserved FROM ledgers WHERE pool_id = 'p1'"))
        await two.execute(text("UPDATE ledgers SET cpu_reserved = 1 WHERE pool_id = 'p1'"))
        await two.commit()
        with pytest.raises(DBAPIError) as caught:
            await one.execute(text("UPDATE ledgers SET cpu_reserved = 2 WHERE pool_id = 'p1'"))
        await one.rollback()
    return caught.value


async def test_transient_kinds_of_real_errors(db: AsyncEngine) -> None:
    async with db.begin() as conn:
        await pool_add(conn, "p1", tenants=["t1"])
    assert transient_kind(await _serialization_failure(db)) == "serialization"

    async with db.connect() as conn:
        with pytest.raises(IntegrityError) as caught:
            await conn.execute(text("UPDATE ledgers SET cpu_reserved = cpu_total + 1"))
    assert transient_kind(caught.value) is None  # a CHECK violation is a bug, not bad luck

    async with db.connect() as victim, db.connect() as killer:
        pid = (await victim.execute(text("SELECT pg_backend_pid()"))).scalar()
        await killer.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        with pytest.raises(DBAPIError) as caught:
            await victim.execute(text("SELECT 1"))
    assert transient_kind(caught.value) == "connection"
    assert transient_kind(ValueError("no")) is None


def test_backoff_doubles_under_a_cap_with_full_jitter() -> None:
    delays = [backoff_delay(a, base_seconds=0.1, max_seconds=0.5, rng=lambda: 1.0)
              for a in range(1, 6)]
    assert delays == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff_delay(3, base_seconds=0.1, max_seconds=0.5, rng=lambda: 0.25) == 0.1


async def test_retry_runs_again_after_a_real_serialization_failure(db: AsyncEngine) -> None:
    async with db.begin() as conn:
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
