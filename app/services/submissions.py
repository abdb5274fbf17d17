"""Submissions without an Idempotency-Key, stored together: concurrent ``createTask`` calls
of one tenant in one process share one statement.

A submission is answered only once its task is committed, and PostgreSQL spends more on a
statement and its commit than on a row. So while a statement storing a tenant's
submissions is in flight, the tenant's next submissions wait for it and then go in together
as one statement (:func:`app.services.batches.tasks_store_unkeyed`, the statement of a task
batch): one execution, one commit for all of them. A submission that finds nothing of its
tenant in flight is stored at once (with those that arrive in the same turn of the event
loop), so coalescing never adds a wait of its own; under load the statements grow instead
of queueing for connections.

A submission waits for its turn no longer than a request waits for a busy pool's connection
(``pool_wait_seconds``, else the connect timeout): one still waiting then is refused like
one that found every connection busy (503 with ``Retry-After``; nothing stored), so a
statement that hangs (a synchronous standby gone, say) holds one connection and one
request, never a growing queue. One already in a statement waits for that statement.

Each submission gets the answer it would get alone: its task (committed), the 429 of the
tenant's queue cap (the first submissions of a statement fill the room left), the 422 of a
spec PostgreSQL cannot hold, or the database fault of its statement (503 for every
submission of that statement; nothing of it was stored). Reconcilers are woken after the
commit, coalesced (:mod:`app.services.wakeups`).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from app.db import Database, PoolBusy
from app.ledger.batches import ITEMS_MAX
from app.ledger.tasks import TaskRow, tenant_queue_full
from app.scheduling.spec import TaskSpec
from app.services.batches import Admitted, BatchEntry, BatchOutcome, tasks_store_unkeyed
from app.services.wakeups import submitted

__all__ = ["task_store"]

#: A tenant's submissions in one process: its id and the queue cap they are stored under.
_Key = tuple[str, int]


@dataclass(slots=True)
class _Waiting:
    """A submission waiting for its statement: its spec (validated, and as JSON values) and
    the future its answer is set on."""

    spec: TaskSpec
    payload: dict[str, Any]
    answer: asyncio.Future[TaskRow]


class _Statements:
    """The statements of one database: per tenant, at most one in flight and the submissions
    waiting for the next."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._waiting: dict[_Key, list[_Waiting]] = {}
        self._flushing: dict[_Key, asyncio.Task[None]] = {}

    def add(self, key: _Key, spec: TaskSpec, payload: dict[str, Any]) -> asyncio.Future[TaskRow]:
        """Queue a submission under ``key``; return the future of its answer."""
        answer: asyncio.Future[TaskRow] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(_Waiting(spec, payload, answer))
        if key not in self._flushing:
            self._flushing[key] = asyncio.get_running_loop().create_task(self._flush(key))
        return answer

    def withdraw(self, key: _Key, answer: asyncio.Future[TaskRow]) -> bool:
        """Take back a submission still waiting for a statement; return False when a
        statement holds it already."""
        waiting = self._waiting.get(key, [])
        for i, w in enumerate(waiting):
            if w.answer is answer:
                del waiting[i]
                return True
        return False

    async def _flush(self, key: _Key) -> None:
        """Store the submissions waiting under ``key``, a statement at a time, until none
        is left."""
        try:
            while waiting := self._waiting.pop(key, None):
                if len(waiting) > ITEMS_MAX:
                    self._waiting[key] = waiting[ITEMS_MAX:]
                    waiting = waiting[:ITEMS_MAX]
                await self._store(key, waiting)
        finally:
            del self._flushing[key]
            # Left only when this task was cancelled (the process is stopping).
            for w in self._waiting.pop(key, ()):
                w.answer.cancel()

    async def _store(self, key: _Key, waiting: list[_Waiting]) -> None:
        """Store ``waiting`` in one statement and answer each submission."""
        tenant_id, max_queued = key
        entries = [BatchEntry(i, w.spec) for i, w in enumerate(waiting)]
        try:
            outcomes = await tasks_store_unkeyed(
                self._db, tenant_id=tenant_id, entries=entries, max_queued=max_queued,
                wake=False,
            )
        except Exception as exc:  # nothing of the statement was stored: each gets its fault
            for w in waiting:
                if not w.answer.done():
                    w.answer.set_exception(exc)
            return
        except BaseException:
            for w in waiting:
                w.answer.cancel()
            raise
        if any(o.status == 201 for o in outcomes.values()):
            submitted(self._db)
        for i, w in enumerate(waiting):
            if not w.answer.done():
                _answer(w, outcomes[i], tenant_id, max_queued)


def _answer(w: _Waiting, outcome: BatchOutcome, tenant_id: str, max_queued: int) -> None:
    """Set a submission's answer from its outcome in the statement."""
    admitted = outcome.admitted
    if admitted is not None:
        w.answer.set_result(_task_row(admitted, w.payload))
    elif outcome.status == 429:
        w.answer.set_exception(tenant_queue_full(tenant_id, max_queued))
    else:
        assert outcome.error is not None
        w.answer.set_exception(outcome.error)


def _task_row(admitted: Admitted, payload: dict[str, Any]) -> TaskRow:
    """Return the row of a task stored just now (ADMITTED, nothing happened to it yet)."""
    assert admitted.seq is not None
    at = admitted.created_at
    return TaskRow(
        id=uuid.UUID(admitted.id), seq=admitted.seq, tenant_id=admitted.tenant_id,
        state="ADMITTED", priority=admitted.priority, runtime_class=payload["runtimeClass"],
        spec=payload, labels=payload.get("labels") or {}, pending_reason=None, placement=None,
        attempts=0, max_attempts=admitted.max_attempts, failure_reason=None, created_at=at,
        updated_at=at, leased_at=None, finished_at=None, created=True,
    )


_statements: weakref.WeakKeyDictionary[Database, _Statements] = weakref.WeakKeyDictionary()


async def task_store(
    db: Database, *, tenant_id: str, spec: TaskSpec, payload: dict[str, Any], max_queued: int
) -> TaskRow:
    """Store a validated spec without a key as an ADMITTED task of ``tenant_id``, together
    with the tenant's concurrent submissions; return its row once committed.

    ``payload`` is the spec as JSON values (camelCase); 429 when the tenant has
    ``max_queued`` queued tasks already (0: no cap).
    """
    statements = _statements.get(db)
    if statements is None:
        statements = _statements[db] = _Statements(db)
    key = (tenant_id, max_queued)
    answer = statements.add(key, spec, payload)
    bound = db.pool_wait_seconds or db.connect_timeout_seconds
    done, _ = await asyncio.wait({answer}, timeout=bound)  # cancels nothing on its own
    if not done and statements.withdraw(key, answer):
        answer.cancel()
        raise PoolBusy(f"the tenant's earlier submissions held the database for {bound:g} s")
    # Shielded: a request that goes away does not take its neighbours' statement with it.
    return await asyncio.shield(answer)
