"""HTTP API: pools — create, read, edit, delete, capacity, and the operator status actions.

Each endpoint parses the request, calls one function of :mod:`app.services.pools` (which
decides who may, and commits before it returns) and serializes the pool it gets back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from app.api.bodies import StrictRoute
from app.api.common import (
    CursorQuery,
    LimitQuery,
    cursor_after_id,
    cursor_encode,
    problems,
)
from app.api.pool_schemas import (
    POOL_ID_RE,
    Capacity,
    DrainPreview,
    DrainRequest,
    Pool,
    PoolCreate,
    PoolPage,
    PoolPatch,
    PoolStatus,
    StatusChange,
    if_match_versions,
)
from app.api.previews import PreviewCursorQuery, PreviewLimitQuery, preview_answer
from app.api.tasks import TenantHeader
from app.api.watch_cursors import list_watch_cursor
from app.auth import AdminDep, Principal, PrincipalDep
from app.ledger.pools import PoolNotFound, PoolRecord
from app.pass_config import ReconcilerConfig
from app.services import pools as service
from app.services.drains import DrainAsk, drain_allowed
from app.services.previews import (
    DEFAULT_LIMIT,
    drain_preview_page,
    drain_scope,
    pools_visible_read,
)
from app.services.tenancy import principal_narrowed

router = APIRouter(prefix="/v1", route_class=StrictRoute)

def _pool_id_known(value: str) -> str:
    """Return ``value``, or raise 404: no pool can have an id outside the id pattern (a NUL,
    an upper-case letter, 64 characters), so such a path names nothing."""
    if not POOL_ID_RE.fullmatch(value):
        raise PoolNotFound()
    return value


PoolIdPath = Annotated[
    str,
    Path(
        alias="poolId",
        description="The pool's id; a value that cannot be a pool id answers 404.",
        examples=["eu-gpu-1"],
    ),
    AfterValidator(_pool_id_known),
]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="Repeat a status action safely: the same key and body replay the first "
        "answer; the same key with a different body is 409.",
    ),
]
IfMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-Match",
        max_length=1024,
        description="The pool's ETag as last read; a stale one is 412.",
    ),
]


def _now() -> datetime:
    return datetime.now(UTC)


def _pool_view(request: Request, record: PoolRecord, principal: Principal) -> Pool:
    freshness = request.app.state.settings.heartbeat_freshness_seconds
    viewer = service.pool_viewer(principal)
    return Pool.of(record, viewer=viewer, now=_now(), freshness_seconds=freshness)


def _tag(response: Response, pool: Pool) -> Pool:
    response.headers["ETag"] = pool.etag
    return pool


@router.post(
    "/pools",
    operation_id="createPool",
    tags=["pools"],
    summary="Create a pool",
    status_code=201,
    response_model=Pool,
    responses=problems(400, 401, 403, 409, 413, 422),
)
async def create_pool(
    body: PoolCreate, principal: AdminDep, request: Request, response: Response
) -> Pool:
    """Create a pool (status ACTIVE); register its capacity with putPoolCapacity before it can
    take work. Admin only; 409 if the id exists."""
    record = await service.create_pool(
        request.app.state.db,
        principal=principal,
        pool_id=body.id,
        fields=body.fields(),
        now=_now(),
    )
    response.headers["Location"] = f"/v1/pools/{body.id}"
    return _tag(response, _pool_view(request, record, principal))


@router.get(
    "/pools",
    operation_id="listPools",
    tags=["pools"],
    summary="List the pools visible to the caller",
    response_model=PoolPage,
    responses=problems(400, 401, 422),
)
async def list_pools(
    principal: PrincipalDep,
    request: Request,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
    status: Annotated[PoolStatus | None, Query(description="Only pools in this status.")] = None,
    runtime_class: Annotated[
        str | None,
        Query(alias="runtimeClass", max_length=64, description="Only pools of this class."),
    ] = None,
    tenant: TenantHeader = None,
) -> PoolPage:
    """List visible pools in id order with their ledger view and health: an admin sees all,
    a tenant those listing it, an operator those it operates or that list its tenants, a
    runtime those of its instances. `X-Berth-Tenant` narrows a key's tenants to the one it
    names."""
    tokens = await request.app.state.tokens.get()
    after = cursor_after_id(tokens, cursor, scope="pools")
    principal = principal_narrowed(principal, tenant)
    watch_cursor = await list_watch_cursor(request)
    records, last = await service.list_pools(
        request.app.state.db,
        principal=principal,
        limit=limit,
        after=after,
        status=status.value if status else None,
        runtime_class=runtime_class,
    )
    return PoolPage(
        items=[_pool_view(request, r, principal) for r in records],
        next_cursor=cursor_encode(tokens, last, scope="pools") if last is not None else None,
        watch_cursor=watch_cursor,
    )


@router.get(
    "/pools/{poolId}",
    operation_id="getPool",
    tags=["pools"],
    summary="Get a pool",
    response_model=Pool,
    responses=problems(400, 401, 404),
)
async def get_pool(
    pool_id: PoolIdPath, principal: PrincipalDep, request: Request, response: Response,
    tenant: TenantHeader = None,
) -> Pool:
    """Return one pool with its ledger view, health and drain progress; 404 when it does not
    exist or is not visible to the caller (as narrowed by `X-Berth-Tenant`)."""
    principal = principal_narrowed(principal, tenant)
    record = await service.get_pool(request.app.state.db, principal=principal, pool_id=pool_id)
    return _tag(response, _pool_view(request, record, principal))


@router.patch(
    "/pools/{poolId}",
    operation_id="updatePool",
    tags=["pools"],
    summary="Change a pool's fields",
    response_model=Pool,
    responses=problems(400, 401, 403, 404, 412, 413, 422),
    openapi_extra={
        "requestBody": {
            "content": {
                "application/merge-patch+json": {
                    "schema": {"$ref": "#/components/schemas/PoolPatch"}
                },
                "application/json": {"schema": {"$ref": "#/components/schemas/PoolPatch"}},
            }
        }
    },
)
async def update_pool(
    pool_id: PoolIdPath,
    body: PoolPatch,
    principal: AdminDep,
    request: Request,
    response: Response,
    if_match: IfMatchHeader = None,
) -> Pool:
    """Merge the body into the pool (RFC 7396: absent fields stay, a null label removes it)
    and bump its version. Send the ETag you read as If-Match: if the pool changed since,
    the answer is 412 and nothing changes. Admin only."""
    record = await service.update_pool(
        request.app.state.db,
        principal=principal,
        pool_id=pool_id,
        changes=body.changes(),
        label_changes=body.label_changes(),
        accepted_versions=if_match_versions(if_match) if if_match is not None else None,
        now=_now(),
    )
    return _tag(response, _pool_view(request, record, principal))


@router.delete(
    "/pools/{poolId}",
    operation_id="deletePool",
    tags=["pools"],
    summary="Delete a pool",
    status_code=204,
    response_class=Response,
    responses=problems(401, 403, 404, 409),
)
async def delete_pool(pool_id: PoolIdPath, principal: AdminDep, request: Request) -> Response:
    """Delete a pool, its ledger and its lease history; 409 while any lease or reservation
    still holds capacity on it (drain it first). Admin only."""
    await service.delete_pool(request.app.state.db, principal=principal, pool_id=pool_id)
    return Response(status_code=204)


@router.put(
    "/pools/{poolId}/capacity",
    operation_id="putPoolCapacity",
    tags=["pools"],
    summary="Register or change a pool's ledger totals",
    response_model=Pool,
    responses=problems(401, 403, 404, 409, 413, 422),
)
async def put_pool_capacity(
    pool_id: PoolIdPath,
    body: Capacity,
    principal: AdminDep,
    request: Request,
    response: Response,
) -> Pool:
    """Set the pool's capacity totals. A pool without totals never takes work. A total may
    not go below what is reserved now (409 naming the dimension); raising one wakes pending
    tasks. Admin only."""
    record = await service.put_pool_capacity(
        request.app.state.db,
        principal=principal,
        pool_id=pool_id,
        totals=body.as_tuple(),
        now=_now(),
    )
    return _tag(response, _pool_view(request, record, principal))


async def _status_action(
    request: Request,
    *,
    operation: str,
    status: PoolStatus,
    pool_id: str,
    body: StatusChange | DrainRequest | None,
    principal: Principal,
    idempotency_key: str | None,
) -> Response:
    answer = await service.change_pool_status(
        request.app.state.db,
        principal=principal,
        operation=operation,
        pool_id=pool_id,
        status=status.value,
        reason=body.reason if body is not None else None,
        deadline=body.deadline if isinstance(body, DrainRequest) else None,
        idempotency_key=idempotency_key,
        render=lambda record: _pool_view(request, record, principal).model_dump(
            mode="json", by_alias=True
        ),
        now=_now(),
    )
    headers = dict(answer.headers)
    if answer.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(answer.body, status_code=answer.status, headers=headers)


_ACTION_RESPONSES = {
    200: {"model": Pool, "description": "The pool with its new status."},
    **problems(401, 403, 404, 409, 413, 422),
}


@router.post(
    "/pools/{poolId}/cordon",
    operation_id="cordonPool",
    summary="Cordon a pool: keep its leases, take no new placements",
    tags=["operators"],
    response_model=Pool,
    responses=_ACTION_RESPONSES,
)
async def cordon_pool(
    pool_id: PoolIdPath,
    principal: PrincipalDep,
    request: Request,
    body: Annotated[StatusChange | None, Body()] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Set the pool CORDONED: existing leases keep running, new placements skip the pool.
    For the pool's operators (and admins); the body is optional."""
    return await _status_action(
        request,
        operation="cordonPool",
        status=PoolStatus.CORDONED,
        pool_id=pool_id,
        body=body,
        principal=principal,
        idempotency_key=idempotency_key,
    )


@router.post(
    "/pools/{poolId}/drain",
    operation_id="drainPool",
    summary="Drain a pool: no new placements, optionally revoke leases at a deadline",
    tags=["operators"],
    response_model=Pool,
    responses=_ACTION_RESPONSES,
)
async def drain_pool(
    pool_id: PoolIdPath,
    principal: PrincipalDep,
    request: Request,
    body: Annotated[DrainRequest | None, Body()] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Set the pool DRAINING: new placements skip it and `drainProgress.leasesLeft` counts
    the leases still running. When the optional deadline passes, the remaining leases are
    revoked and their tasks requeued. For the pool's operators (and admins)."""
    return await _status_action(
        request,
        operation="drainPool",
        status=PoolStatus.DRAINING,
        pool_id=pool_id,
        body=body,
        principal=principal,
        idempotency_key=idempotency_key,
    )


@router.post(
    "/pools/{poolId}/activate",
    operation_id="activatePool",
    summary="Activate a pool: take new placements again",
    tags=["operators"],
    response_model=Pool,
    responses=_ACTION_RESPONSES,
)
async def activate_pool(
    pool_id: PoolIdPath,
    principal: PrincipalDep,
    request: Request,
    body: Annotated[StatusChange | None, Body()] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Set the pool ACTIVE (clearing any drain deadline) and wake pending tasks that may now
    fit. For the pool's operators (and admins); the body is optional."""
    return await _status_action(
        request,
        operation="activatePool",
        status=PoolStatus.ACTIVE,
        pool_id=pool_id,
        body=body,
        principal=principal,
        idempotency_key=idempotency_key,
    )


@router.post(
    "/pools/{poolId}/drain-preview",
    operation_id="previewPoolDrain",
    summary="Preview a drain: where each of the pool's leased tasks would go now",
    tags=["operators"],
    response_model=DrainPreview,
    responses=problems(400, 401, 403, 404, 429, 503),
)
async def preview_pool_drain(
    pool_id: PoolIdPath,
    principal: PrincipalDep,
    request: Request,
    limit: PreviewLimitQuery = DEFAULT_LIMIT,
    cursor: PreviewCursorQuery = None,
) -> Response:
    """For each live lease of the pool, the pool its task would be placed on if the lease
    were revoked now, or why it would wait — decided as a reconciler pass decides, with this
    pool draining, the capacity the tasks hold elsewhere given back, and each task seeing the
    ones decided before it. A gang moves as a unit. The summary counts every lease: how many
    would go to each pool, how many would wait and why; `items` is one page of `limit`
    leases and `nextCursor` the next. Pools the caller cannot see are never named: a move
    there is counted (`membersElsewhere`, `toPoolsNotShown`). Reserves and changes nothing.
    For the pool's operators (and admins). Too many previews at once on this process: 429
    with Retry-After."""
    db = request.app.state.db
    await drain_allowed(db, principal=principal, pool_id=pool_id)
    ask = DrainAsk(pool_id, ReconcilerConfig.from_settings(request.app.state.settings), _now())
    visible = await pools_visible_read(db, principal=principal)
    return await preview_answer(
        request, scope=drain_scope(pool_id, principal), cursor=cursor, limit=limit,
        compute=drain_preview_page, args=(ask, visible),
    )
