"""The queue snapshot cache of getTask: one read per class at a time, even under load."""

from __future__ import annotations

import asyncio

import pytest

from app.db import Database
from app.services import queue as queue_service
from tests.factories import spec_make, tasks_add


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the real queue reads the cache makes (each still runs against the database)."""
    calls: list[str] = []
    real = queue_service.queue_class_read

    async def counted(conn, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs["runtime_class"])
        await asyncio.sleep(0.05)  # a slow read, so that the requests below overlap it
        return await real(conn, **kwargs)

    monkeypatch.setattr(queue_service, "queue_class_read", counted)
    return calls


async def _get_many(db: Database, cache: queue_service.QueueCache, n: int) -> list[int]:
    async def one() -> int:
        async with db.connection() as conn:
            snapshot = await cache.get(conn, runtime_class="standard", limit=100,
                                       aging_seconds=60.0)
        return id(snapshot)

    return await asyncio.gather(*(one() for _ in range(n)))


async def test_concurrent_first_reads_share_one_queue_read(db: Database, reads: list[str]) -> None:
    async with db.transaction() as conn:
        await tasks_add(conn, tenant="acme", count=5, spec=spec_make())
    cache = queue_service.QueueCache(max_age_seconds=60)
    snapshots = await _get_many(db, cache, 8)
    assert reads == ["standard"]
    assert len(set(snapshots)) == 1


async def test_an_expired_snapshot_is_read_again_once_while_others_get_the_stale_one(
    db: Database, reads: list[str]
) -> None:
    cache = queue_service.QueueCache(max_age_seconds=0)  # every entry is already stale
    await _get_many(db, cache, 1)
    assert len(reads) == 1
    await _get_many(db, cache, 8)
    assert len(reads) == 2, "an expiry under load must cost one read, not one per request"
