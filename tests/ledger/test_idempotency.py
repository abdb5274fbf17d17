"""Idempotency-Key records on real separate connections: replay, conflict, and the race."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from app.db import Connection, Database
from app.ledger.idempotency import (
    IdempotencyKeyReused,
    StoredResponse,
    idempotency_claim,
    idempotency_store,
)
from app.services.idempotency import request_hash

KEY_OPS, KEY_ADM = uuid.uuid4(), uuid.uuid4()
RECORD = {"key_id": KEY_OPS, "operation": "cordonPool", "key": "k1"}


async def claim(conn: Connection, payload: object) -> StoredResponse | None:
    """Claim the test key for ``payload``."""
    return await idempotency_claim(conn, **RECORD, request_hash=request_hash(payload))


async def blocked_on_a_lock(db: Database, pid: int, waiter: asyncio.Task) -> None:
    """Return once backend ``pid`` waits on a lock (or ``waiter`` already ended)."""
    async with db.connection() as conn:
        while not waiter.done():
            waiting = await conn.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
            )
            if waiting:
                return
            await asyncio.sleep(0.01)


async def backend_pid(conn: Connection) -> int:
    """Return the server process id of ``conn``."""
    return int(await conn.fetchval("SELECT pg_backend_pid()"))


def test_request_hash_ignores_key_order() -> None:
    assert request_hash({"a": 1, "b": [1, 2]}) == request_hash({"b": [1, 2], "a": 1})
    assert request_hash({"a": 1}) != request_hash({"a": 2})


async def test_first_claim_owns_the_key_then_replays_and_refuses(db: Database) -> None:
    async with db.transaction() as conn:
        assert await claim(conn, {"reason": "r"}) is None
        await idempotency_store(conn, **RECORD, status_code=200, body={"status": "CORDONED"})

    async with db.transaction() as conn:
        replay = await claim(conn, {"reason": "r"})
    async with db.transaction() as conn:
        with pytest.raises(IdempotencyKeyReused):
            await claim(conn, {"reason": "other"})

    assert replay == StoredResponse(status_code=200, body={"status": "CORDONED"})


async def test_keys_are_scoped_by_api_key_and_operation(db: Database) -> None:
    async with db.transaction() as conn:
        for key_id, operation in ((KEY_OPS, "cordonPool"), (KEY_OPS, "drainPool"),
                                  (KEY_ADM, "cordonPool")):
            owned = await idempotency_claim(
                conn, key_id=key_id, operation=operation, key="k1", request_hash="h"
            )
            assert owned is None


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
async def test_a_concurrent_duplicate_waits_for_the_first(
    db: Database, first_commits: bool
) -> None:
    async with db.connection() as first, db.connection() as second:
        first_tx = first.transaction()
        await first_tx.start()
        assert await claim(first, {"reason": "r"}) is None
        second_tx = second.transaction()
        await second_tx.start()
        pid = await backend_pid(second)
        duplicate = asyncio.create_task(claim(second, {"reason": "r"}))
        await blocked_on_a_lock(db, pid, duplicate)

        if first_commits:
            await idempotency_store(first, **RECORD, status_code=200, body={"n": 1})
            await first_tx.commit()
        else:
            await first_tx.rollback()
        answer = await duplicate
        await second_tx.rollback()

    if first_commits:
        assert answer == StoredResponse(status_code=200, body={"n": 1})
    else:
        assert answer is None, "the first gave up, so the duplicate owns the key"
