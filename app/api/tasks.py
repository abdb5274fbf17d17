"""HTTP API: tasks — submit (idempotent), list, get, events, cancel.

Only tenant keys reach these routes, and each sees only the tasks of the tenants it acts
for: a task of another tenant answers 404, exactly like one that does not exist. A key that
acts for several tenants names the one it submits for in ``X-Berth-Tenant``; reads cover
all of its tenants unless that header narrows them (:mod:`app.services.tenancy`).

createTask and getTask are the API's hot paths: they are direct routes
(:mod:`app.api.direct_routes`) that read their request themselves and declare their contract
with ``openapi_extra``; the answers are those of a regular route. Task JSON is built by
:func:`task_json` as the :class:`~app.api.task_schemas.Task` shape and serialized by orjson.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response

from app.api.bodies import StrictRoute
from app.api.common import CursorQuery, LimitQuery, problems
from app.api.direct_routes import (
    DirectRoute,
    body_read,
    body_validate,
    header_parameter,
    path_parameter,
    string_read,
    validation_raise,
)
from app.api.task_schemas import (
    FastJSONResponse,
    Task,
    TaskEventPage,
    TaskPage,
    TaskState,
    task_event_json,
    task_json,
)
from app.api.watch_cursors import list_watch_cursor
from app.auth import (
    TENANT,
    TenantDep,
    app_state,
    header_get,
    principal_from_request,
    role_check,
)
from app.errors import BadRequest
from app.ledger.tasks import TaskNotFound
from app.scheduling.spec import TaskSpec
from app.services import tasks as service
from app.services.tenancy import tenants_reading
from app.services.tokens import InvalidToken, Tokens, scope_events, scope_tasks

router = APIRouter(prefix="/v1", tags=["tasks"], route_class=StrictRoute)
#: createTask and getTask: the hot routes, whose endpoints read the request themselves.
direct_router = APIRouter(prefix="/v1", tags=["tasks"], route_class=DirectRoute)

TENANT_HEADER = "X-Berth-Tenant"
TENANT_HEADER_MAX = 128
TENANT_HEADER_DESCRIPTION = "The tenant to act for; required only when the key acts for several."
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_HEADER_MAX = 255
IDEMPOTENCY_DESCRIPTION = (
    "Repeat a submission safely: the same key and body return the original "
    "task (200); the same key with another body is 409."
)
TASK_ID_DESCRIPTION = "The task id (a UUID); any other value answers 404."
_TENANT_HEADER_NAME = TENANT_HEADER.lower().encode()
_IDEMPOTENCY_HEADER_NAME = IDEMPOTENCY_HEADER.lower().encode()

TenantHeader = Annotated[
    str | None,
    Header(alias=TENANT_HEADER, max_length=TENANT_HEADER_MAX,
           description=TENANT_HEADER_DESCRIPTION),
]
TaskIdPath = Annotated[str, Path(alias="taskId", description=TASK_ID_DESCRIPTION)]

_SECURITY: list[dict[str, list[str]]] = [{"HTTPBearer": []}]
_TENANT_PARAMETER = header_parameter(
    TENANT_HEADER, TENANT_HEADER_DESCRIPTION, max_length=TENANT_HEADER_MAX
)


def cursor_position(tokens: Tokens, cursor: str | None, *, scope: str) -> int:
    """Return the position (a seq or event id) sealed in a list cursor of ``scope``; 0
    without one; 400 for a cursor this list did not give."""
    if cursor is None:
        return 0
    try:
        return tokens.open(cursor, scope=scope)
    except InvalidToken:
        raise BadRequest("the cursor is not valid; pass back the nextCursor of a list") from None


def task_id_parse(value: str) -> uuid.UUID:
    """Return ``value`` as a task UUID, or raise 404 (no task can have a malformed id)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise TaskNotFound() from None


def _tenant_header(request: Request, errors: list[dict[str, Any]]) -> str | None:
    return string_read(
        header_get(request, _TENANT_HEADER_NAME), ("header", TENANT_HEADER), errors,
        max_length=TENANT_HEADER_MAX,
    )


@direct_router.post(
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
        **problems(400, 401, 403, 409, 413, 422, 429),
    },
    openapi_extra={
        "security": _SECURITY,
        "parameters": [
            header_parameter(IDEMPOTENCY_HEADER, IDEMPOTENCY_DESCRIPTION, min_length=1,
                             max_length=IDEMPOTENCY_HEADER_MAX),
            _TENANT_PARAMETER,
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TaskSpec"}}},
        },
    },
)
async def create_task(request: Request) -> Response:
    """Submit a task for placement; it is stored as ADMITTED and reconcilers are woken.

    Unknown fields are 422. With `Idempotency-Key`, a repeat of the same body returns the
    original task with 200 instead of creating another. 429 (with `Retry-After`) when the
    tenant has as many queued tasks as `BERTH_MAX_QUEUED_TASKS_PER_TENANT` allows.
    """
    body = await body_read(request, TaskSpec)
    principal = role_check(principal_from_request(request), TENANT)
    errors: list[dict[str, Any]] = []
    idempotency_key = string_read(
        header_get(request, _IDEMPOTENCY_HEADER_NAME), ("header", IDEMPOTENCY_HEADER), errors,
        min_length=1, max_length=IDEMPOTENCY_HEADER_MAX,
    )
    tenant = _tenant_header(request, errors)
    spec = body_validate(body, TaskSpec, errors)
    validation_raise(errors)
    assert spec is not None
    state = app_state(request)
    row = await service.task_submit(
        state["db"],
        principal=principal,
        tenant=tenant,
        spec=spec,
        idempotency_key=idempotency_key,
        max_queued=state["settings"].max_queued_tasks_per_tenant,
    )
    return FastJSONResponse(
        task_json(row),
        status_code=201 if row.created else 200,
        headers={"Location": f"/v1/tasks/{row.id}"},
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
    tokens = await request.app.state.tokens.get()
    scope = scope_tasks(tenants_reading(principal, tenant))
    watch_cursor = await list_watch_cursor(request)
    rows, next_seq = await service.tasks_page(
        request.app.state.db,
        principal=principal,
        tenant=tenant,
        after_seq=cursor_position(tokens, cursor, scope=scope),
        state=state.value if state is not None else None,
        runtime_class=runtime_class,
        limit=limit,
    )
    page: TaskPage = {
        "items": [task_json(r) for r in rows],
        "nextCursor": None if next_seq is None else tokens.seal(next_seq, scope=scope),
        "watchCursor": watch_cursor,
    }
    return FastJSONResponse(page)


@direct_router.get(
    "/tasks/{taskId}",
    operation_id="getTask",
    summary="Get a task with its explanation",
    response_model=Task,
    responses=problems(400, 401, 403, 404, 422),
    openapi_extra={
        "security": _SECURITY,
        "parameters": [
            path_parameter("taskId", TASK_ID_DESCRIPTION),
            _TENANT_PARAMETER,
        ],
    },
)
async def get_task(request: Request) -> Response:
    """Return a task: state, pending reason or placement with alternatives, lease, attempts,
    and while ADMITTED its queue position and estimated start."""
    principal = role_check(principal_from_request(request), TENANT)
    errors: list[dict[str, Any]] = []
    tenant = _tenant_header(request, errors)
    validation_raise(errors)
    task_id = task_id_parse(request.path_params["taskId"])
    state = app_state(request)
    row, queue = await service.task_get(
        state["db"], principal=principal, tenant=tenant, task_id=task_id,
        settings=state["settings"], queue_cache=state["queue_cache"],
        offload=state["offload"],
    )
    return FastJSONResponse(task_json(row, queue))


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
    tokens = await request.app.state.tokens.get()
    scope = scope_events(tid)
    after = cursor_position(tokens, cursor, scope=scope)
    events, next_id = await service.task_events_page(
        request.app.state.db, principal=principal, tenant=tenant, task_id=tid,
        after_id=after, limit=limit,
    )
    # An event's id and the cursor after it are the same token: a client may resume after
    # any event it has seen.
    page: TaskEventPage = {
        "items": [task_event_json(e, tokens.seal(e.id, scope=scope)) for e in events],
        "nextCursor": None if next_id is None else tokens.seal(next_id, scope=scope),
    }
    return FastJSONResponse(page)


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
    request: Request,
    tenant: TenantHeader = None,
) -> Response:
    """Cancel a task that has not finished; a leased task's capacity is released.

    A task that already succeeded, failed or was cancelled answers 409. So does a task a
    reconciler pass has been placing for more than a second (`task-being-scheduled`, with
    `Retry-After`): retry, and the cancel applies to the task as the pass left it.
    """
    row = await service.task_cancel(
        request.app.state.db, principal=principal, tenant=tenant, task_id=task_id_parse(task_id)
    )
    return FastJSONResponse(task_json(row))
