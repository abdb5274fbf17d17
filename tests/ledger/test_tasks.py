"""Task SQL on both drivers: a SQLAlchemy connection (the caller's transaction) and raw
asyncpg autocommit connections (the API's hot path)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.ledger.driver import StatementPool
from app.ledger.tasks import (
    IdempotencyKeyReused,
    SpecHasNul,
    task_events_list,
    task_get,
    task_list,
    task_submit,
)

SPEC = {"runtimeClass": "py", "requests": {"cpuMillis": 100}, "labels": {"a": "b"}}
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


async def count(db: AsyncEngine, table: str) -> int:
    async with db.connect() as conn:
        return int(await conn.scalar(text(f"SELECT count(*) FROM {table}")))


async def test_submit_runs_inside_the_callers_transaction(db: AsyncEngine):
    async with db.connect() as conn:
        async with conn.begin() as tx:
            row = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key=None, now=NOW)
            assert row.created and row.state == "ADMITTED"
            seen = await task_get(conn, task_id=row.id, tenant_ids=["t"])
            assert seen is not None and seen.spec == SPEC and seen.created_at == NOW
            await tx.rollback()
    assert await count(db, "tasks") == 0
    assert await count(db, "task_events") == 0


async def test_raw_pool_submits_reads_lists_and_dedupes(db: AsyncEngine):
    pool = StatementPool.for_engine(db, max_size=4)
    try:
        async with pool.connection() as conn:
            first = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k",
                                      now=NOW)
            again = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k",
                                      now=NOW)
            assert first.created and not again.created and again.id == first.id
            with pytest.raises(IdempotencyKeyReused):
                await task_submit(conn, tenant_id="t", spec={**SPEC, "priority": 1},
                                  idempotency_key="k", now=NOW)
            assert await task_get(conn, task_id=first.id, tenant_ids=["other"]) is None
            rows, nxt = await task_list(conn, tenant_ids=["t"], limit=1)
            assert [r.id for r in rows] == [first.id] and nxt is None
            events, _ = await task_events_list(conn, task_id=first.id)
            assert [(e.to_state, e.reason, e.at) for e in events] == [
                ("ADMITTED", "submitted", NOW)]
    finally:
        await pool.close()


async def test_concurrent_raw_submissions_with_one_key_store_one_task(db: AsyncEngine):
    pool = StatementPool.for_engine(db, max_size=8)

    async def submit():
        async with pool.connection() as conn:
            return await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="race",
                                     now=NOW)

    try:
        rows = await asyncio.gather(*(submit() for _ in range(8)))
    finally:
        await pool.close()
    assert sum(r.created for r in rows) == 1
    assert len({r.id for r in rows}) == 1
    assert await count(db, "tasks") == 1


@pytest.mark.parametrize("value", ["nul\x00here", "\\\x00"], ids=["nul", "escaped-then-nul"])
async def test_a_nul_character_is_refused_before_the_database(db: AsyncEngine, value):
    async with db.begin() as conn:
        with pytest.raises(SpecHasNul):
            await task_submit(conn, tenant_id="t", spec={**SPEC, "labels": {"a": value}},
                              idempotency_key=None, now=NOW)


async def test_a_backslash_u0000_text_is_not_a_nul(db: AsyncEngine):
    async with db.begin() as conn:
        row = await task_submit(conn, tenant_id="t", spec={**SPEC, "labels": {"a": "\\u0000"}},
                                idempotency_key=None, now=NOW)
    assert row.created
