"""Concurrent submissions of a tenant share statements against the real database: each gets
the answer it would get alone, the tenant's cap holds across them, and a statement's fault
is the answer of every submission it held and stores nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.auth import Principal
from app.db import Database, PoolBusy
from app.ledger.tasks import SpecHasNul, TenantQueueFull
from app.scheduling.spec import TaskSpec
from app.services import submissions
from app.services.tasks import task_get, task_submit

TENANT = Principal(subject="t", role="tenant", tenant_ids=frozenset({"acme"}),
                   runtime_instance_ids=frozenset())


def spec(cpu: int, **fields: Any) -> TaskSpec:
    return TaskSpec.model_validate({"runtimeClass": "gpu-small",
                                    "requests": {"cpuMillis": cpu, "memoryMiB": 1}, **fields})


async def submit(db: Database, task_spec: TaskSpec, *, max_queued: int = 0) -> Any:
    return await task_submit(db, principal=TENANT, tenant=None, spec=task_spec,
                             idempotency_key=None, max_queued=max_queued)


async def count(db: Database, sql: str) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval(sql))


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each statement the submissions were stored by, in order."""
    sizes: list[int] = []
    store = submissions.tasks_store_unkeyed

    async def counted(db: Database, **kwargs: Any) -> Any:
        sizes.append(len(kwargs["entries"]))
        return await store(db, **kwargs)

    monkeypatch.setattr(submissions, "tasks_store_unkeyed", counted)
    return sizes


async def test_concurrent_submissions_share_statements_and_each_gets_its_task(
    db: Database, statements: list[int]
) -> None:
    rows = await asyncio.gather(*(submit(db, spec(i + 1, labels={"n": str(i)}))
                                  for i in range(40)))
    assert all(row.created and row.state == "ADMITTED" for row in rows)
    assert sum(statements) == 40 and len(statements) < 40
    assert len({row.id for row in rows}) == 40 and len({row.seq for row in rows}) == 40
    for i, row in enumerate(rows):
        assert row.spec["requests"]["cpuMillis"] == i + 1 and row.labels == {"n": str(i)}
        stored, _ = await task_get(db, principal=TENANT, tenant=None, task_id=row.id)
        assert (stored.seq, stored.spec, stored.labels, stored.created_at) == (
            row.seq, row.spec, row.labels, row.created_at)
    assert await count(db, "SELECT count(*) FROM task_events") == 40
    assert await count(db, "SELECT sum(queued) FROM tenant_queue_counts") == 40


async def test_a_lone_submission_is_stored_at_once_by_a_statement_of_its_own(
    db: Database, statements: list[int]
) -> None:
    for i in range(3):
        assert (await submit(db, spec(i + 1))).created
    assert statements == [1, 1, 1]


async def test_the_tenant_cap_holds_across_the_submissions_of_a_statement(
    db: Database, statements: list[int]
) -> None:
    sent = []
    for i in range(30):  # one a turn of the event loop: most arrive while a statement runs
        sent.append(asyncio.create_task(submit(db, spec(i + 1), max_queued=10)))
        await asyncio.sleep(0)
    answers = await asyncio.gather(*sent, return_exceptions=True)
    stored = [a for a in answers if not isinstance(a, BaseException)]
    refused = [a for a in answers if isinstance(a, BaseException)]
    assert len(stored) == 10 and len(refused) == 20
    assert all(isinstance(e, TenantQueueFull) for e in refused)
    assert refused[0].extra["headers"] == {"Retry-After": "10"}
    # In submission order: the first ten fill the room.
    assert [row.spec["requests"]["cpuMillis"] for row in stored] == list(range(1, 11))
    assert await count(db, "SELECT count(*) FROM tasks") == 10


async def test_a_spec_postgresql_cannot_hold_is_that_submission_s_422_alone(
    db: Database, statements: list[int]
) -> None:
    answers = await asyncio.gather(
        submit(db, spec(1)), submit(db, spec(2)), submit(db, spec(3, labels={"a": "\x00"})),
        submit(db, spec(4)), return_exceptions=True)
    assert isinstance(answers[2], SpecHasNul)
    assert [a.spec["requests"]["cpuMillis"] for a in answers if not isinstance(
        a, BaseException)] == [1, 2, 4]
    assert await count(db, "SELECT count(*) FROM tasks") == 3


async def test_a_statement_s_fault_answers_every_submission_it_held(
    database_url: str, db: Database, statements: list[int]
) -> None:
    small = Database(database_url, max_size=1, pool_wait_seconds=0.2)
    try:
        async with small.connection():  # the pool's one connection is busy: no statement
            answers = await asyncio.gather(*(submit(small, spec(i + 1)) for i in range(5)),
                                           return_exceptions=True)
        assert all(isinstance(a, PoolBusy) for a in answers), answers
        assert await count(db, "SELECT count(*) FROM tasks") == 0
        row = await submit(small, spec(9))  # the connection is back: stored at once
        assert row.created and await count(db, "SELECT count(*) FROM tasks") == 1
    finally:
        await small.close()


async def test_a_submission_that_goes_away_leaves_its_statement_to_the_others(
    db: Database, statements: list[int]
) -> None:
    first = asyncio.create_task(submit(db, spec(1)))
    others = [asyncio.create_task(submit(db, spec(i + 2))) for i in range(5)]
    await asyncio.sleep(0)
    others[2].cancel()  # waiting for the second statement, like a client that disconnected
    answers = await asyncio.gather(first, *others, return_exceptions=True)
    assert isinstance(answers[3], asyncio.CancelledError)
    assert all(not isinstance(a, BaseException) for i, a in enumerate(answers) if i != 3)
    # Its task was stored with its neighbours all the same, as a request's would be whose
    # client goes away after sending it.
    assert await count(db, "SELECT count(*) FROM tasks") == 6



async def _lock_waited(conn: Any) -> None:
    """Wait until a statement of another connection waits for a lock."""
    for _ in range(200):
        if await conn.fetchval("SELECT count(*) FROM pg_stat_activity "
                               "WHERE wait_event_type = 'Lock' AND state = 'active'"):
            return
        await asyncio.sleep(0.025)
    raise AssertionError("no statement waited for the lock")


async def test_a_submission_waits_for_a_hung_statement_no_longer_than_for_a_connection(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "pool_wait_seconds", 0.3)
    blocker = await db.connect()
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE")
        first = asyncio.ensure_future(submit(db, spec(1)))
        await _lock_waited(blocker)
        later = await asyncio.gather(*(submit(db, spec(2)) for _ in range(3)),
                                     return_exceptions=True)
        # Refused like a caller that found every connection busy; the first still waits.
        assert all(isinstance(r, PoolBusy) for r in later), later
        assert not first.done()
        await tx.rollback()
    finally:
        await blocker.close()
    row = await first
    assert row.created
    assert await count(db, "SELECT count(*) FROM tasks") == 1
