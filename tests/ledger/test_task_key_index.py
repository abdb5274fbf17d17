"""The partial unique index on task idempotency keys (revision 0003): keyed tasks stay unique
per tenant, unkeyed tasks are not indexed at all."""

from __future__ import annotations

from datetime import UTC, datetime

from app.db import Database
from app.ledger.tasks import task_submit

SPEC = {"runtimeClass": "py", "requests": {"cpuMillis": 100}}
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


async def test_only_keyed_tasks_are_indexed_and_keys_stay_unique(db: Database) -> None:
    async with db.transaction() as conn:
        for _ in range(3):
            await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key=None,
                              request_hash=None, now=NOW)
        first = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k",
                                  request_hash="h", now=NOW)
        again = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k",
                                  request_hash="h", now=NOW)
        other = await task_submit(conn, tenant_id="u", spec=SPEC, idempotency_key="k",
                                  request_hash="h", now=NOW)
    assert first.created and not again.created and again.id == first.id
    assert other.created and other.id != first.id
    async with db.connection() as conn:
        definition = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'uq_tasks_tenant_idempotency_key'"
        )
        total = await conn.fetchval("SELECT count(*) FROM tasks")
    assert "UNIQUE" in definition and "WHERE (idempotency_key IS NOT NULL)" in definition
    assert total == 5
