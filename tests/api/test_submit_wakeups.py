"""Submissions wake reconcilers after their commit, one NOTIFY per round trip under load.

A submission's statement sends no NOTIFY (a notifying transaction holds PostgreSQL's one
notification lock through its commit, so notifying submissions commit one at a time); the
service sends a ``submitted`` wakeup once the task is committed, coalesced per database.
"""

from __future__ import annotations

import asyncio

import httpx

from app.db import Database
from app.ledger.wakeups import WakeSource, Wakeup
from app.services.wakeups import submitted
from tests.api.conftest import Keys
from tests.api.test_tasks import spec


async def _sources(queue: asyncio.Queue[str], *, settle: float = 0.5) -> list[WakeSource]:
    """Return the wakeup sources notified until none came for ``settle`` seconds."""
    got: list[WakeSource] = []
    while True:
        try:
            got.append(Wakeup.parse(await asyncio.wait_for(queue.get(), timeout=settle)).source)
        except TimeoutError:
            return got


async def test_a_submission_wakes_reconcilers_once_it_is_committed(
    client: httpx.AsyncClient, keys: Keys, db: Database, wakeups: asyncio.Queue[str]
) -> None:
    r = await client.post("/v1/tasks", json=spec(), headers=keys.tenant_a)
    assert r.status_code == 201
    wakeup = Wakeup.parse(await asyncio.wait_for(wakeups.get(), timeout=10))
    assert wakeup.source is WakeSource.SUBMITTED
    # A replay stores nothing and wakes nobody.
    key = {"Idempotency-Key": "k-1"}
    first = await client.post("/v1/tasks", json=spec(), headers={**keys.tenant_a, **key})
    assert first.status_code == 201
    assert await _sources(wakeups) == [WakeSource.SUBMITTED]
    again = await client.post("/v1/tasks", json=spec(), headers={**keys.tenant_a, **key})
    assert again.status_code == 200
    assert await _sources(wakeups) == []


async def test_submissions_in_flight_together_share_wakeups(
    db: Database, wakeups: asyncio.Queue[str]
) -> None:
    # Commits before a wakeup is sent are covered by it: one wakeup for 100.
    for _ in range(100):
        submitted(db)
    assert await _sources(wakeups) == [WakeSource.SUBMITTED]
    # 100 commits land while a wakeup is in flight (the first one was started and is
    # waiting on the database): exactly one more is sent after it, for all of them.
    submitted(db)
    await asyncio.sleep(0)
    for _ in range(100):
        submitted(db)
    assert await _sources(wakeups) == [WakeSource.SUBMITTED, WakeSource.SUBMITTED]
