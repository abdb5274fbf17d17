"""HTTP API: task batches — up to 1,000 submissions in one request.

``POST /v1/task-batches`` takes ``{"items": [{"spec": {…}, "idempotencyKey"?}, …]}`` and
answers 200 with one result per item, in request order: ``{"index", "status", "task",
"problem"}``, where ``status`` is what ``createTask`` would have answered for that item
alone (201, 200, 409, 422, 429) and ``problem`` the problem it would have answered. One bad
item does not reject the others; the envelope does: a body that is not a JSON object with a
list of 1 to 1,000 ``items`` (and nothing else) is 422 as a whole, like every other body.

An item is validated exactly as a ``createTask`` body (the same strict model, the same
messages); its problem's ``errors`` locate the fault inside the item (``["spec",
"requests", "cpuMillis"]``). The envelope is checked by hand and the items by the model, all
in one call (a list of items); only when one is invalid are they validated again one at a
time, for each item's own answer.

The answer of a stored task is written as text around its stored spec's JSON (every other
field of a new task is a constant), and the rest of the answer by orjson: per item, no
decoded spec and no dictionary to serialize.

The endpoint reads its request itself, like the direct routes
(:mod:`app.api.direct_routes`): after the front door verified the key (401), the body
strictly (415, 400), then the role (403), then
the header and the envelope (422). Its body limit is ``BERTH_MAX_BATCH_BODY_BYTES`` instead
of ``BERTH_MAX_BODY_BYTES`` (:mod:`app.api.limits`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Request, Response
from pydantic import Field, TypeAdapter, ValidationError, WithJsonSchema

from app.api.bodies import StrictRoute, json_body_read
from app.api.common import CamelModel, RequestModel, problems
from app.api.direct_routes import header_parameter, string_read, validation_raise
from app.api.problems import problem_json, validation_problem_json
from app.api.task_schemas import Task, task_json
from app.api.tasks import (
    IDEMPOTENCY_HEADER_MAX,
    TENANT_HEADER,
    TENANT_HEADER_DESCRIPTION,
    TENANT_HEADER_MAX,
)
from app.auth import TENANT, principal_from_request, role_check
from app.errors import BerthError
from app.scheduling.spec import TaskSpec
from app.services import batches as service

router = APIRouter(prefix="/v1", tags=["tasks"], route_class=StrictRoute)

PATH = "/v1/task-batches"
#: The most items one batch may hold.
ITEMS_MAX = 1000


class TaskBatchItem(RequestModel):
    """One submission of a batch: a task spec and, optionally, its idempotency key."""

    spec: TaskSpec
    idempotency_key: str | None = Field(
        default=None, min_length=1, max_length=IDEMPOTENCY_HEADER_MAX,
        description="Repeat this item safely: the same key and spec give the original task "
        "(200), the same key with another spec 409. The same keys as the Idempotency-Key "
        "header of createTask (per tenant).",
    )


_ProblemOrNull = Annotated[
    dict[str, Any] | None,
    WithJsonSchema({"anyOf": [{"$ref": "#/components/schemas/Problem"}, {"type": "null"}]}),
]


class TaskBatchResult(CamelModel):
    """What one item got: the status createTask would have answered, and its task or
    problem."""

    index: int = Field(ge=0, description="The item's position in the request (from 0).")
    status: int = Field(
        description="201 stored; 200 a repeat of its idempotencyKey with the same spec (the "
        "original task); 409 the key was used with another spec; 422 invalid; 429 the "
        "tenant's queued-task cap is reached."
    )
    task: Task | None = Field(description="The task (status 200 or 201), else null.")
    problem: _ProblemOrNull = Field(description="The item's problem (4xx), else null.")


class TaskBatchResults(CamelModel):
    """One result per item, in the order of the request."""

    items: list[TaskBatchResult]


#: Every item at once: the usual batch, all valid, in one validation call.
_ITEMS = TypeAdapter(list[TaskBatchItem])

_ITEM_SCHEMA = TaskBatchItem.model_json_schema(
    by_alias=True, ref_template="#/components/schemas/{model}"
)
_ITEM_SCHEMA.pop("$defs", None)
_BATCH_SCHEMA = {
    "title": "TaskBatch",
    "type": "object",
    "description": "Up to 1,000 task submissions; each item is answered on its own.",
    "required": ["items"],
    "additionalProperties": False,
    "properties": {
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": ITEMS_MAX,
            "items": _ITEM_SCHEMA,
            "title": "Items",
        },
    },
}

_ENVELOPE_KEYS = frozenset({"items"})


def _envelope_items(body: Any, errors: list[dict[str, Any]]) -> list[Any] | None:
    """Return the items of a batch body, or add the envelope's errors (FastAPI's messages)."""
    if not isinstance(body, dict):
        errors.append({"type": "model_attributes_type", "loc": ("body",),
                       "msg": "Input should be a valid dictionary or object to extract fields "
                       "from", "input": body})
        return None
    for name in sorted(set(body) - _ENVELOPE_KEYS):
        errors.append({"type": "extra_forbidden", "loc": ("body", name),
                       "msg": "Extra inputs are not permitted", "input": body[name]})
    items = body.get("items")
    if "items" not in body:
        errors.append({"type": "missing", "loc": ("body", "items"), "msg": "Field required",
                       "input": body})
    elif not isinstance(items, list):
        errors.append({"type": "list_type", "loc": ("body", "items"),
                       "msg": "Input should be a valid list", "input": items})
    elif not items:
        errors.append({"type": "too_short", "loc": ("body", "items"),
                       "msg": "List should have at least 1 item after validation, not 0",
                       "input": items})
    elif len(items) > ITEMS_MAX:
        errors.append({"type": "too_long", "loc": ("body", "items"),
                       "msg": f"List should have at most {ITEMS_MAX} items after validation, "
                       f"not {len(items)}", "input": None})
    return items if not errors else None


class _AdmittedText:
    """The answers of tasks stored just now, as JSON text: :func:`task_json` of an ADMITTED
    task, whose fields besides its id, spec, priority and attempts are those of every new
    task of the batch (one tenant, one creation time)."""

    def __init__(self) -> None:
        self._tenant_id = ""
        self._created_at: datetime | None = None
        self._head = self._tail = ""

    def __call__(self, index: int, status: int, task: service.Admitted) -> str:
        if task.tenant_id != self._tenant_id or task.created_at != self._created_at:
            self._tenant_id, self._created_at = task.tenant_id, task.created_at
            at = orjson.dumps(task.created_at, option=orjson.OPT_UTC_Z).decode()
            self._head = f',"tenantId":{orjson.dumps(task.tenant_id).decode()}' \
                ',"state":"ADMITTED","spec":'
            self._tail = (f',"createdAt":{at},"updatedAt":{at},"leasedAt":null,'
                          '"finishedAt":null,"pendingReason":null,"placement":null,'
                          '"lease":null,"leases":[],"failureReason":null,"queue":null},'
                          '"problem":null}')
        return (f'{{"index":{index},"status":{status},"task":{{"id":"{task.id}"{self._head}'
                f'{task.spec_json},"priority":{task.priority},"attempts":0,'
                f'"maxAttempts":{task.max_attempts}{self._tail}')


def _error_json(error: BerthError) -> dict[str, Any]:
    extra = {k: v for k, v in error.extra.items() if k != "headers"}
    return problem_json(error.status, title=error.title, detail=error.detail,
                        type_uri=error.type_uri, **extra)


@router.post(
    "/task-batches",
    operation_id="createTaskBatch",
    summary="Submit up to 1,000 tasks",
    response_model=TaskBatchResults,
    responses={
        200: {"description": "One result per item, in request order; every stored task is "
              "committed."},
        **problems(400, 401, 403, 413, 422),
    },
    openapi_extra={
        "security": [{"HTTPBearer": []}],
        "parameters": [
            header_parameter(
                TENANT_HEADER, TENANT_HEADER_DESCRIPTION, max_length=TENANT_HEADER_MAX
            ),
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _BATCH_SCHEMA}},
        },
    },
)
async def create_task_batch(request: Request) -> Response:
    """Submit up to 1,000 task specs at once; each item gets the answer createTask would
    give it alone.

    The answer is 200 with one result per item, in request order (`index`, `status`, `task`
    or `problem`): 201 stored, 200 a repeat of its `idempotencyKey` with the same spec, 409
    the key used with another spec, 422 an invalid spec, 429 the tenant's queued-task cap
    (`BERTH_MAX_QUEUED_TASKS_PER_TENANT`) reached. A key repeated within the batch replays
    its first occurrence. Every stored task is committed before the answer. A body that is
    not `{"items": [...]}` with 1 to 1,000 items is 422 as a whole.
    """
    raw = await request.body()
    body = None
    if raw:
        body = await json_body_read(raw, request.headers.get("content-type"))
    principal = role_check(principal_from_request(request), TENANT)
    errors: list[dict[str, Any]] = []
    tenant = string_read(request.headers.get(TENANT_HEADER), ("header", TENANT_HEADER), errors,
                         max_length=TENANT_HEADER_MAX)
    if not raw:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required",
                       "input": None})
        items = None
    else:
        items = _envelope_items(body, errors)
    validation_raise(errors)
    assert items is not None

    results: list[str | None] = [None] * len(items)
    entries: list[service.BatchEntry] = []
    try:
        valid_items = _ITEMS.validate_python(items, from_attributes=True)
    except ValidationError:
        validate = TaskBatchItem.model_validate
        for index, item in enumerate(items):
            try:
                valid = validate(item, from_attributes=True)
            except ValidationError as e:
                results[index] = orjson.dumps({
                    "index": index, "status": 422, "task": None,
                    "problem": validation_problem_json(e.errors(include_url=False)),
                }).decode()
                continue
            entries.append(service.BatchEntry(index, valid.spec, valid.idempotency_key))
    else:
        entries = [service.BatchEntry(index, valid.spec, valid.idempotency_key)
                   for index, valid in enumerate(valid_items)]

    outcomes = await service.task_batch_submit(
        request.app.state.db,
        principal=principal,
        tenant=tenant,
        entries=entries,
        max_queued=request.app.state.settings.max_queued_tasks_per_tenant,
    )
    admitted = _AdmittedText()
    for index, outcome in outcomes.items():
        if outcome.admitted is not None:
            results[index] = admitted(index, outcome.status, outcome.admitted)
            continue
        results[index] = orjson.dumps({
            "index": index,
            "status": outcome.status,
            "task": task_json(outcome.row) if outcome.row is not None else None,
            "problem": _error_json(outcome.error) if outcome.error is not None else None,
        }, option=orjson.OPT_UTC_Z).decode()
    body = '{"items":[' + ",".join(results) + "]}"  # type: ignore[arg-type]
    return Response(body.encode(), media_type="application/json")
