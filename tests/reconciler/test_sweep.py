"""The idempotency sweeper: the leader deletes records older than the retention, in batches."""

from __future__ import annotations

import uuid
from datetime import timedelta

from app.config import SHARD_SLOTS, Settings
from app.db import Database
from app.ledger.idempotency import idempotency_claim, idempotency_store
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW

ALL = frozenset(range(SHARD_SLOTS))
RETENTION = timedelta(hours=24)


async def records_add(db: Database, *, count: int, age: timedelta) -> None:
    """Store ``count`` answered records created ``age`` before NOW."""
    key_id = uuid.uuid4()
    async with db.transaction() as conn:
        for i in range(count):
            key = f"k-{age.total_seconds()}-{i}"
            await idempotency_claim(conn, key_id=key_id, operation="completeLease", key=key,
                                    request_hash="h")
            await idempotency_store(conn, key_id=key_id, operation="completeLease", key=key,
                                    status_code=200, body={"i": i})
        await conn.execute("UPDATE idempotency_records SET created_at = $1 WHERE key_id = $2",
                           NOW - age, key_id)


async def ages(db: Database) -> list[timedelta]:
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT created_at FROM idempotency_records ORDER BY created_at")
    return [NOW - r["created_at"] for r in rows]


def reconciler(db: Database, name: str, **config: object) -> Reconciler:
    cfg = ReconcilerConfig(idempotency_retention_seconds=RETENTION.total_seconds(), **config)
    return Reconciler(db, cfg, owner_id=name, slots=ALL)


async def test_records_older_than_the_retention_are_deleted_in_batches(db: Database) -> None:
    await records_add(db, count=7, age=RETENTION + timedelta(minutes=1))
    await records_add(db, count=3, age=RETENTION - timedelta(minutes=1))
    sweeper = reconciler(db, "s", sweep_batch=2, sweep_batches_max=3)
    try:
        # 3 batches of 2 at most in one round: 6 of the 7 expired records; the next round
        # deletes the last one; the young records stay.
        assert await sweeper.sweep_once(now=NOW) == 6
        assert await sweeper.sweep_once(now=NOW) == 1
        assert await sweeper.sweep_once(now=NOW) == 0
        assert await ages(db) == [RETENTION - timedelta(minutes=1)] * 3
        # An hour later the young ones are past the retention too.
        assert await sweeper.sweep_once(now=NOW + timedelta(hours=1)) == 3
        assert await ages(db) == []
    finally:
        await sweeper.close()


async def test_only_the_leader_sweeps(db: Database) -> None:
    await records_add(db, count=4, age=RETENTION * 2)
    first, second = reconciler(db, "a"), reconciler(db, "b")
    try:
        assert await first.ownership.leader()
        assert not await second.ownership.leader()
        assert await second.sweep_once(now=NOW) == 0
        assert len(await ages(db)) == 4
        assert await first.sweep_once(now=NOW) == 4
    finally:
        await first.close()
        await second.close()


def test_the_retention_setting_reaches_the_reconciler() -> None:
    settings = Settings(idempotency_retention_hours=2)
    assert ReconcilerConfig.from_settings(settings).idempotency_retention_seconds == 7200
    assert Settings().idempotency_retention_hours == 24
