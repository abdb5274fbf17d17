"""The partial unique index on task idempotency keys (revision 0003): keyed tasks stay unique
per tenant, unkeyed tasks are not indexed at all."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.ledger.tasks import task_submit

SPEC = {"runtimeClass": "py", "requests": {"cpuMillis": 100}}
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


async def test_only_keyed_tasks_are_indexed_and_keys_stay_unique(db: AsyncEngine) -> None:
    async with db.begin() as conn:
        for _ in range(3):
            await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key=None, now=NOW)
        first = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k", now=NOW)
        again = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k", now=NOW)
        other = await task_submit(conn, tenant_id="u", spec=SPEC, idempotency_key="k", now=NOW)
    assert first.created and not again.created and again.id == first.id
    assert other.created and other.id != first.id
    async with db.connect() as conn:
        definition = await conn.scalar(text(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'uq_tasks_tenant_idempotency_key'"
        ))
        total = await conn.scalar(text("SELECT count(*) FROM tasks"))
        await conn.rollback()
    assert "UNIQUE" in definition and "WHERE (idempotency_key IS NOT NULL)" in definition
    assert total == 5
