"""Tasks: submit, read, list, history and cancel, for the tenants a key acts for.

Submission is one statement on an autocommit connection (the insert and its event are one
atomic round trip), so it is committed when :func:`task_submit` returns; a tenant's
concurrent submissions without an Idempotency-Key share that statement
(:mod:`app.services.submissions`). Reconcilers are woken after the commit, coalesced
(:mod:`app.services.wakeups`).
Cancel locks, changes and releases in one transaction that commits before
:func:`task_cancel` returns. Reads use an autocommit connection.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from app.auth import Principal
from app.config import Settings
from app.db import Database
from app.ledger import tasks as ledger
from app.ledger.leases import task_cancel as ledger_task_cancel
from app.ledger.tasks import TaskEventRow, TaskNotFound, TaskRow
from app.scheduling.spec import TaskSpec
from app.services.idempotency import request_hash
from app.services.offload import Offload
from app.services.queue import QueueCache, TaskQueue, queue_eta_fill, task_queue_read
from app.services.submissions import task_store
from app.services.tenancy import tenant_acting, tenants_reading
from app.services.wakeups import submitted

__all__ = ["task_cancel", "task_events_page", "task_get", "task_submit", "tasks_page"]


async def task_submit(
    db: Database,
    *,
    principal: Principal,
    tenant: str | None,
    spec: TaskSpec,
    idempotency_key: str | None,
    max_queued: int = 0,
) -> TaskRow:
    """Store a task for the tenant the key acts for; a keyed repeat returns the original.

    The row's ``created`` says whether this call stored it (201) or found it (200); 429 when
    the tenant has ``max_queued`` queued tasks already (0: no cap).
    """
    tenant_id = tenant_acting(principal, tenant)
    payload = spec.model_dump(mode="json", by_alias=True)
    if idempotency_key is None:
        return await task_store(db, tenant_id=tenant_id, spec=spec, payload=payload,
                                max_queued=max_queued)
    digest = request_hash({"tenantId": tenant_id, "spec": payload})
    async with db.connection() as conn:
        row = await ledger.task_submit(
            conn,
            tenant_id=tenant_id,
            spec=payload,
            idempotency_key=idempotency_key,
            request_hash=digest,
            now=datetime.now(UTC),
            max_queued=max_queued,
        )
    if row.created:
        submitted(db)
    return row


async def task_get(
    db: Database,
    *,
    principal: Principal,
    tenant: str | None,
    task_id: uuid.UUID,
    settings: Settings | None = None,
    queue_cache: QueueCache | None = None,
    offload: Offload | None = None,
) -> tuple[TaskRow, TaskQueue | None]:
    """Return a task of the tenants the key reads for, with its queue position and ETA while
    ADMITTED (when ``settings`` and ``offload``, the workers that estimate, are given), or
    raise TaskNotFound."""
    tenants = tenants_reading(principal, tenant)
    queue, ask = None, None
    async with db.connection() as conn:
        row = await ledger.task_get(conn, task_id=task_id, tenant_ids=tenants)
        if row is None:
            raise TaskNotFound()
        if settings is not None and offload is not None and row.state == "ADMITTED":
            queue, ask = await task_queue_read(conn, row=row, settings=settings,
                                               now=datetime.now(UTC), cache=queue_cache)
    if queue is not None:
        # The connection is back in the pool while a worker plans.
        queue = await queue_eta_fill(queue, ask, offload=offload)  # type: ignore[arg-type]
    return row, queue


async def tasks_page(
    db: Database,
    *,
    principal: Principal,
    tenant: str | None,
    after_seq: int,
    state: str | None,
    runtime_class: str | None,
    limit: int,
) -> tuple[list[TaskRow], int | None]:
    """Return a page of the key's tasks in admission order and the seq to resume after."""
    tenants = tenants_reading(principal, tenant)
    async with db.connection() as conn:
        return await ledger.task_list(
            conn,
            tenant_ids=tenants,
            after_seq=after_seq,
            state=state,
            runtime_class=runtime_class,
            limit=limit,
        )


async def task_events_page(
    db: Database,
    *,
    principal: Principal,
    tenant: str | None,
    task_id: uuid.UUID,
    after_id: int,
    limit: int,
) -> tuple[list[TaskEventRow], int | None]:
    """Return a page of a visible task's transitions and the id to resume after."""
    tenants = tenants_reading(principal, tenant)
    async with db.connection() as conn:
        if await ledger.task_get(conn, task_id=task_id, tenant_ids=tenants) is None:
            raise TaskNotFound()
        return await ledger.task_events_list(conn, task_id=task_id, after_id=after_id,
                                             limit=limit)


async def task_cancel(
    db: Database, *, principal: Principal, tenant: str | None, task_id: uuid.UUID
) -> TaskRow:
    """Cancel a visible task (releasing a leased task's capacity), commit, return it."""
    tenants = tenants_reading(principal, tenant)
    async with db.transaction() as conn:
        row = await ledger.task_get(conn, task_id=task_id, tenant_ids=tenants)
        if row is None:
            raise TaskNotFound()
        await ledger_task_cancel(
            conn, task_id=task_id, tenant_id=row.tenant_id, now=datetime.now(UTC)
        )
        row = await ledger.task_get(conn, task_id=task_id, tenant_ids=tenants)
    assert row is not None
    return row
