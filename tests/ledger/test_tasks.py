"""Task SQL: inside a caller's transaction, and on autocommit connections (the API's path)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.claims import tasks_claim
from app.ledger.idempotency import IdempotencyKeyReused
from app.ledger.tasks import (
    SpecHasNul,
    task_events_list,
    task_get,
    task_list,
    task_submit,
)
from app.services.idempotency import request_hash

SPEC = {"runtimeClass": "py", "requests": {"cpuMillis": 100}, "labels": {"a": "b"}}
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def digest(spec: dict[str, Any], tenant_id: str = "t") -> str:
    return request_hash({"tenantId": tenant_id, "spec": spec})


async def count(db: Database, table: str) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))


async def test_submit_runs_inside_the_callers_transaction(db: Database):
    async with db.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        row = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key=None,
                                request_hash=None, now=NOW)
        assert row.created and row.state == "ADMITTED"
        seen = await task_get(conn, task_id=row.id, tenant_ids=["t"])
        assert seen is not None and seen.spec == SPEC and seen.created_at == NOW
        await tx.rollback()
    assert await count(db, "tasks") == 0
    assert await count(db, "task_events") == 0


async def test_autocommit_submits_reads_lists_and_dedupes(db: Database):
    async with db.connection() as conn:
        first = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k",
                                  request_hash=digest(SPEC), now=NOW)
        again = await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="k",
                                  request_hash=digest(SPEC), now=NOW)
        assert first.created and not again.created and again.id == first.id
        other = {**SPEC, "priority": 1}
        with pytest.raises(IdempotencyKeyReused) as caught:
            await task_submit(conn, tenant_id="t", spec=other, idempotency_key="k",
                              request_hash=digest(other), now=NOW)
        assert caught.value.type_uri.endswith("idempotency-key-reused")
        assert await task_get(conn, task_id=first.id, tenant_ids=["other"]) is None
        rows, nxt = await task_list(conn, tenant_ids=["t"], limit=1)
        assert [r.id for r in rows] == [first.id] and nxt is None
        events, _ = await task_events_list(conn, task_id=first.id)
        assert [(e.to_state, e.reason, e.at) for e in events] == [
            ("ADMITTED", "submitted", NOW)]
    # Autocommit: visible to another connection at once.
    assert await count(db, "tasks") == 1


async def test_concurrent_autocommit_submissions_with_one_key_store_one_task(db: Database):
    async def submit():
        async with db.connection() as conn:
            return await task_submit(conn, tenant_id="t", spec=SPEC, idempotency_key="race",
                                     request_hash=digest(SPEC), now=NOW)

    rows = await asyncio.gather(*(submit() for _ in range(8)))
    assert sum(r.created for r in rows) == 1
    assert len({r.id for r in rows}) == 1
    assert await count(db, "tasks") == 1


@pytest.mark.parametrize("value", ["nul\x00here", "\\\x00"], ids=["nul", "escaped-then-nul"])
async def test_a_nul_character_is_refused_before_the_database(db: Database, value):
    async with db.transaction() as conn:
        with pytest.raises(SpecHasNul):
            await task_submit(conn, tenant_id="t", spec={**SPEC, "labels": {"a": value}},
                              idempotency_key=None, request_hash=None, now=NOW)


async def test_a_backslash_u0000_text_is_not_a_nul(db: Database):
    async with db.transaction() as conn:
        row = await task_submit(conn, tenant_id="t", spec={**SPEC, "labels": {"a": "\\u0000"}},
                                idempotency_key=None, request_hash=None, now=NOW)
    assert row.created


async def test_the_spec_is_stored_and_claimed_as_the_text_written(db: Database):
    """``tasks.spec`` is ``json`` (revision 0013_spec_json, decision 13): the claim returns
    the text a submission wrote, byte for byte, and reads decode it to the same spec."""
    spec = {"runtimeClass": "py", "requests": {"memoryMiB": 64, "cpuMillis": 100},
            "labels": {"z": "1", "a": "2"}, "priority": 3}
    async with db.connection() as conn:
        row = await task_submit(conn, tenant_id="t", spec=spec, idempotency_key=None,
                                request_hash=None, now=NOW)
        assert await conn.fetchval(
            "SELECT pg_typeof(spec)::text FROM tasks WHERE id = $1", row.id) == "json"
        assert (await task_get(conn, task_id=row.id, tenant_ids=["t"])).spec == spec
    async with db.transaction() as conn:
        claimed = await tasks_claim(conn, slots=range(SHARD_SLOTS), batch=10, now=NOW)
    assert [c.id for c in claimed] == [row.id]
    assert claimed[0].spec_json == orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode()
    assert claimed[0].spec == spec
