"""HTTP API: tasks — submit (idempotent), list, get, events, cancel.

Only tenant keys reach these routes, and each sees only the tasks of the tenants it acts
for: a task of another tenant answers 404, exactly like one that does not exist. A key that
acts for several tenants names the one it submits for in ``X-Berth-Tenant``; reads cover
all of its tenants unless that header narrows them.

The submit path is the API's hot path: the body is validated once by the core's
:class:`TaskSpec`, stored by one SQL statement, and the answer is serialized by orjson
without building response objects. Plain submissions and reads are answered ahead of these
routes by :mod:`app.api.fast`, which hands everything else to them. Both answer through
:func:`task_submit_answer` and :func:`task_get_answer` and choose tenants with
:func:`tenant_acting` / :func:`tenants_reading`, so an answer changes in one place
(tests/api/test_fast.py checks that both agree).
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response

from app.api.common import CursorQuery, LimitQuery, cursor_decode, cursor_encode, problems
from app.api.task_schemas import (
    FastJSONResponse,
    Task,
    TaskEventPage,
    TaskPage,
    TaskState,
    task_event_json,
    task_json,
)
from app.auth import Principal, TenantDep
from app.db import ConnDep
from app.errors import BadRequest, NotFound
from app.ledger.driver import Statements
from app.ledger.leases import task_cancel
from app.ledger.tasks import task_events_list, task_get, task_list, task_submit
from app.scheduling.spec import TaskSpec

router = APIRouter(tags=["tasks"])

TENANT_HEADER = "X-Berth-Tenant"


class TaskNotFound(NotFound):
    """The task does not exist (or belongs to another tenant)."""

    type_slug = "task-not-found"


class TenantAmbiguous(BadRequest):
    """This key acts for several tenants: name one in the X-Berth-Tenant header."""


class TenantUnknown(BadRequest):
    """The X-Berth-Tenant header names a tenant this key does not act for."""


TenantHeader = Annotated[
    str | None,
    Header(
        alias=TENANT_HEADER,
        max_length=128,
        description="The tenant to act for; required only when the key acts for several.",
    ),
]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="Repeat a submission safely: the same key and body return the original "
        "task (200); the same key with another body is 409.",
    ),
]
TaskIdPath = Annotated[
    str, Path(alias="taskId", max_length=64, description="The task id (a UUID).")
]


def tenant_acting(principal: Principal, header: str | None) -> str:
    """Return the one tenant a write acts for, from the key and ``X-Berth-Tenant``."""
    if header is not None:
        if header not in principal.tenant_ids:
            raise TenantUnknown()
        return header
    if len(principal.tenant_ids) == 1:
        return next(iter(principal.tenant_ids))
    if not principal.tenant_ids:
        raise TenantUnknown("this key acts for no tenant")
    raise TenantAmbiguous()


def tenants_reading(principal: Principal, header: str | None) -> frozenset[str]:
    """Return the tenants a read covers: all of the key's, or the one ``X-Berth-Tenant`` names."""
    if header is None:
        return principal.tenant_ids
    if header not in principal.tenant_ids:
        raise TenantUnknown()
    return frozenset((header,))


def statement_connection(request: Request) -> AbstractAsyncContextManager[Statements]:
    """Return the app's raw autocommit connection for single-statement endpoints."""
    return request.app.state.statements.connection()


def cursor_position(cursor: str | None) -> int:
    """Return the position (a seq or event id) inside a list cursor; 0 without one."""
    if cursor is None:
        return 0
    position = cursor_decode(cursor)
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < 2**63:
        raise BadRequest("the cursor is not valid; pass back the nextCursor of a list")
    return position


def task_id_parse(value: str) -> uuid.UUID:
    """Return ``value`` as a task UUID, or raise 404 (no task can have a malformed id)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise TaskNotFound() from None


async def task_submit_answer(
    conn: Statements, *, tenant_id: str, spec: TaskSpec, idempotency_key: str | None
) -> FastJSONResponse:
    """Store a submission and return its answer: 201 with Location, or 200 for a repeat.

    One statement stores the task, its event and the wakeup, so autocommit is atomic enough.
    Both the regular createTask route and its fast path (app/api/fast.py) answer through this.
    """
    row = await task_submit(
        conn,
        tenant_id=tenant_id,
        spec=spec.model_dump(mode="json", by_alias=True),
        idempotency_key=idempotency_key,
        now=datetime.now(UTC),
    )
    return FastJSONResponse(
        task_json(row),
        status_code=201 if row.created else 200,
        headers={"Location": f"/v1/tasks/{row.id}"},
    )


async def task_get_answer(
    conn: Statements, *, task_id: uuid.UUID, tenant_ids: frozenset[str]
) -> FastJSONResponse:
    """Return the answer to reading a task of ``tenant_ids``, or raise 404."""
    row = await task_get(conn, task_id=task_id, tenant_ids=tenant_ids)
    if row is None:
        raise TaskNotFound()
    return FastJSONResponse(task_json(row))


@router.post(
    "/tasks",
    operation_id="createTask",
    summary="Submit a task",
    status_code=201,
    response_model=Task,
    responses={
        200: {"model": Task, "description": "A repeat of an earlier submission with the "
              "same Idempotency-Key and body: the original task."},
        201: {
            "description": "The task, stored as ADMITTED.",
            "headers": {"Location": {"description": "URL of the task.",
                                     "schema": {"type": "string"}}},
        },
        **problems(400, 401, 403, 409, 413, 422),
    },
)
async def create_task(
    spec: TaskSpec,
    principal: TenantDep,
    request: Request,
    idempotency_key: IdempotencyKeyHeader = None,
    tenant: TenantHeader = None,
) -> Response:
    """Submit a task for placement; it is stored as ADMITTED and reconcilers are woken.

    Unknown fields are 422. With `Idempotency-Key`, a repeat of the same body returns the
    original task with 200 instead of creating another.
    """
    tenant_id = tenant_acting(principal, tenant)
    async with statement_connection(request) as conn:
        return await task_submit_answer(
            conn, tenant_id=tenant_id, spec=spec, idempotency_key=idempotency_key
        )


@router.get(
    "/tasks",
    operation_id="listTasks",
    summary="List own tasks",
    response_model=TaskPage,
    responses=problems(400, 401, 403, 422),
)
async def list_tasks(
    principal: TenantDep,
    request: Request,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
    state: Annotated[TaskState | None, Query(description="Only tasks in this state.")] = None,
    runtime_class: Annotated[
        str | None,
        Query(
            alias="runtimeClass",
            pattern=r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$",
            description="Only this runtime class.",
        ),
    ] = None,
    tenant: TenantHeader = None,
) -> Response:
    """List the caller's tasks in admission order, a page at a time."""
    tenants = tenants_reading(principal, tenant)
    async with statement_connection(request) as conn:
        rows, next_seq = await task_list(
            conn,
            tenant_ids=tenants,
            after_seq=cursor_position(cursor),
            state=state.value if state is not None else None,
            runtime_class=runtime_class,
            limit=limit,
        )
    return FastJSONResponse(
        {
            "items": [task_json(r) for r in rows],
            "nextCursor": cursor_encode(next_seq) if next_seq is not None else None,
        }
    )


@router.get(
    "/tasks/{taskId}",
    operation_id="getTask",
    summary="Get a task with its explanation",
    response_model=Task,
    responses=problems(400, 401, 403, 404),
)
async def get_task(
    task_id: TaskIdPath,
    principal: TenantDep,
    request: Request,
    tenant: TenantHeader = None,
) -> Response:
    """Return a task: state, pending reason or placement with alternatives, lease, attempts."""
    tid = task_id_parse(task_id)
    tenants = tenants_reading(principal, tenant)
    async with statement_connection(request) as conn:
        return await task_get_answer(conn, task_id=tid, tenant_ids=tenants)


@router.get(
    "/tasks/{taskId}/events",
    operation_id="listTaskEvents",
    summary="List a task's transitions",
    response_model=TaskEventPage,
    responses=problems(400, 401, 403, 404, 422),
)
async def list_task_events(
    task_id: TaskIdPath,
    principal: TenantDep,
    request: Request,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
    tenant: TenantHeader = None,
) -> Response:
    """List the task's state transitions, oldest first, each with a reason code."""
    tid = task_id_parse(task_id)
    tenants = tenants_reading(principal, tenant)
    after = cursor_position(cursor)
    async with statement_connection(request) as conn:
        if await task_get(conn, task_id=tid, tenant_ids=tenants) is None:
            raise TaskNotFound()
        events, next_id = await task_events_list(conn, task_id=tid, after_id=after, limit=limit)
    return FastJSONResponse(
        {
            "items": [task_event_json(e) for e in events],
            "nextCursor": cursor_encode(next_id) if next_id is not None else None,
        }
    )


@router.post(
    "/tasks/{taskId}/cancel",
    operation_id="cancelTask",
    summary="Cancel a task",
    response_model=Task,
    responses=problems(400, 401, 403, 404, 409),
)
async def cancel_task(
    task_id: TaskIdPath,
    principal: TenantDep,
    conn: ConnDep,
    tenant: TenantHeader = None,
) -> Response:
    """Cancel a task that has not finished; a leased task's capacity is released.

    A task that already succeeded, failed or was cancelled answers 409.
    """
    tid = task_id_parse(task_id)
    tenants = tenants_reading(principal, tenant)
    row = await task_get(conn, task_id=tid, tenant_ids=tenants)
    if row is None:
        raise TaskNotFound()
    await task_cancel(conn, task_id=tid, tenant_id=row.tenant_id, now=datetime.now(UTC))
    row = await task_get(conn, task_id=tid, tenant_ids=tenants)
    assert row is not None
    return FastJSONResponse(task_json(row))
