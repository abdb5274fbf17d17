"""HTTP API: pools — create, read, edit, delete, capacity, and the operator status actions.

Who may do what (SPEC §6): an admin manages pools and their capacity; any caller reads the
pools visible to it (see :func:`app.ledger.pools.pool_visible`); the operators named in a
pool's ``operators`` cordon, drain and activate it. An admin may run the status actions too:
the admin already owns every other change to a pool, and an operator who is unreachable must
not leave a pool stuck. A pool the caller cannot see answers 404, never 403, so its
existence is not revealed; a visible pool the caller may not operate answers 403.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api.common import CursorQuery, LimitQuery, cursor_decode, cursor_encode, problems
from app.api.pool_schemas import (
    MAX_LABELS,
    Capacity,
    DrainRequest,
    Pool,
    PoolCreate,
    PoolPage,
    PoolPatch,
    PoolStatus,
    StatusChange,
    if_match_versions,
)
from app.auth import AdminDep, Principal, PrincipalDep
from app.db import ConnDep
from app.errors import BadRequest, Forbidden, Unprocessable
from app.ledger.idempotency import idempotency_claim, idempotency_store, request_hash
from app.ledger.pools import (
    PoolNotFound,
    PoolRecord,
    PoolVersionMismatch,
    PoolViewer,
    pool_capacity_put,
    pool_create,
    pool_delete,
    pool_get,
    pool_operable,
    pool_status_set,
    pool_update,
    pools_list,
)

log = logging.getLogger("berth.api.pools")

router = APIRouter()

PoolIdPath = Annotated[
    str, Path(alias="poolId", max_length=63, description="The pool's id.", examples=["eu-gpu-1"])
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


def viewer_of(principal: Principal) -> PoolViewer:
    """Return the pool viewer a principal reads pools as."""
    return PoolViewer(
        role=principal.role,
        subject=principal.subject,
        tenant_ids=principal.tenant_ids,
        runtime_instance_ids=principal.runtime_instance_ids,
    )


def _pool_view(request: Request, record: PoolRecord, viewer: PoolViewer, now: datetime) -> Pool:
    freshness = request.app.state.settings.heartbeat_freshness_seconds
    return Pool.of(record, viewer=viewer, now=now, freshness_seconds=freshness)


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
    body: PoolCreate, principal: AdminDep, conn: ConnDep, request: Request, response: Response
) -> Pool:
    """Create a pool (status ACTIVE); register its capacity with putPoolCapacity before it can
    take work. Admin only; 409 if the id exists."""
    now = _now()
    record = await pool_create(conn, pool_id=body.id, fields=body.fields(), now=now)
    log.info("pool created", extra={"pool_id": body.id, "subject": principal.subject})
    response.headers["Location"] = f"/v1/pools/{body.id}"
    return _tag(response, _pool_view(request, record, viewer_of(principal), now))


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
    conn: ConnDep,
    request: Request,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
    status: Annotated[PoolStatus | None, Query(description="Only pools in this status.")] = None,
    runtime_class: Annotated[
        str | None,
        Query(alias="runtimeClass", max_length=64, description="Only pools of this class."),
    ] = None,
) -> PoolPage:
    """List visible pools in id order with their ledger view and health: an admin sees all,
    a tenant those listing it, an operator those it operates or that list its tenants, a
    runtime those of its instances."""
    after = None
    if cursor is not None:
        after = cursor_decode(cursor)
        if not isinstance(after, str):
            raise BadRequest("the cursor is not valid; pass back the nextCursor of a list")
    viewer = viewer_of(principal)
    records, last = await pools_list(
        conn,
        viewer=viewer,
        limit=limit,
        after=after,
        status=status.value if status else None,
        runtime_class=runtime_class,
    )
    now = _now()
    return PoolPage(
        items=[_pool_view(request, r, viewer, now) for r in records],
        next_cursor=cursor_encode(last) if last is not None else None,
    )


@router.get(
    "/pools/{poolId}",
    operation_id="getPool",
    tags=["pools"],
    summary="Get a pool",
    response_model=Pool,
    responses=problems(401, 404, 422),
)
async def get_pool(
    pool_id: PoolIdPath,
    principal: PrincipalDep,
    conn: ConnDep,
    request: Request,
    response: Response,
) -> Pool:
    """Return one pool with its ledger view, health and drain progress; 404 when it does not
    exist or is not visible to the caller."""
    viewer = viewer_of(principal)
    record = await pool_get(conn, pool_id=pool_id, viewer=viewer)
    if record is None:
        raise PoolNotFound()
    return _tag(response, _pool_view(request, record, viewer, _now()))


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
                }
            }
        }
    },
)
async def update_pool(
    pool_id: PoolIdPath,
    body: PoolPatch,
    principal: AdminDep,
    conn: ConnDep,
    request: Request,
    response: Response,
    if_match: IfMatchHeader = None,
) -> Pool:
    """Merge the body into the pool (RFC 7396: absent fields stay, a null label removes it)
    and bump its version. Send the ETag you read as If-Match: if the pool changed since,
    the answer is 412 and nothing changes. Admin only."""
    expected = None
    if if_match is not None:
        accepted = if_match_versions(if_match)
        if accepted is not None:
            current = await pool_get(conn, pool_id=pool_id)
            if current is None:
                raise PoolNotFound()
            if current.version not in accepted:
                raise PoolVersionMismatch()
            expected = current.version
    viewer = viewer_of(principal)
    changes, labels = body.changes(), body.label_changes()
    if not changes and not labels:
        record = await pool_get(conn, pool_id=pool_id)
        if record is None:
            raise PoolNotFound()
    else:
        record = await pool_update(
            conn,
            pool_id=pool_id,
            changes=changes,
            label_changes=labels,
            expected_version=expected,
            now=_now(),
        )
        if len(record.labels) > MAX_LABELS:
            raise Unprocessable(
                f"labels: a pool has at most {MAX_LABELS} labels",
                extra={"errors": [{"loc": ["body", "labels"], "msg": "too many labels"}]},
            )
        log.info(
            "pool updated",
            extra={"pool_id": pool_id, "subject": principal.subject, "version": record.version},
        )
    return _tag(response, _pool_view(request, record, viewer, _now()))


@router.delete(
    "/pools/{poolId}",
    operation_id="deletePool",
    tags=["pools"],
    summary="Delete a pool",
    status_code=204,
    response_class=Response,
    responses=problems(401, 403, 404, 409, 422),
)
async def delete_pool(
    pool_id: PoolIdPath,
    principal: AdminDep,
    conn: ConnDep,
) -> Response:
    """Delete a pool, its ledger and its lease history; 409 while any lease or reservation
    still holds capacity on it (drain it first). Admin only."""
    await pool_delete(conn, pool_id=pool_id)
    log.info("pool deleted", extra={"pool_id": pool_id, "subject": principal.subject})
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
    conn: ConnDep,
    request: Request,
    response: Response,
) -> Pool:
    """Set the pool's capacity totals. A pool without totals never takes work. A total may
    not go below what is reserved now (409 naming the dimension); raising one wakes pending
    tasks. Admin only."""
    now = _now()
    record = await pool_capacity_put(conn, pool_id=pool_id, totals=body.as_tuple(), now=now)
    log.info(
        "pool capacity set",
        extra={"pool_id": pool_id, "subject": principal.subject, "totals": body.as_tuple()},
    )
    return _tag(response, _pool_view(request, record, viewer_of(principal), now))


async def _status_action(
    *,
    operation: str,
    status: PoolStatus,
    pool_id: str,
    body: StatusChange | DrainRequest | None,
    principal: Principal,
    conn: AsyncConnection,
    request: Request,
    idempotency_key: str | None,
) -> Response:
    viewer = viewer_of(principal)
    record = await pool_get(conn, pool_id=pool_id, viewer=viewer)
    if record is None:
        raise PoolNotFound()
    if not pool_operable(record, viewer):
        raise Forbidden(
            f"only the pool's operators (or an admin) may {operation.removesuffix('Pool')} it"
        )
    now = _now()
    deadline = body.deadline if isinstance(body, DrainRequest) else None
    if deadline is not None and deadline <= now:
        raise Unprocessable(
            "deadline: a drain deadline must be in the future",
            extra={"errors": [{"loc": ["body", "deadline"], "msg": "must be in the future"}]},
        )
    payload = body.model_dump(mode="json", by_alias=True, exclude_none=True) if body else {}
    if idempotency_key is not None:
        digest = request_hash({"poolId": pool_id, "body": payload})
        stored = await idempotency_claim(
            conn,
            subject=principal.subject,
            operation=operation,
            key=idempotency_key,
            request_hash=digest,
        )
        if stored is not None:
            return JSONResponse(
                stored.body,
                status_code=stored.status_code,
                headers={"ETag": stored.body.get("etag", ""), "Idempotent-Replayed": "true"},
            )
    record = await pool_status_set(
        conn,
        pool_id=pool_id,
        status=status.value,
        reason=body.reason if body is not None else None,
        drain_deadline=deadline,
        now=now,
    )
    log.info(
        "pool status changed",
        extra={
            "pool_id": pool_id,
            "status": status.value,
            "subject": principal.subject,
            "drain_deadline": deadline.isoformat() if deadline else None,
        },
    )
    view = _pool_view(request, record, viewer, now).model_dump(mode="json", by_alias=True)
    if idempotency_key is not None:
        await idempotency_store(
            conn,
            subject=principal.subject,
            operation=operation,
            key=idempotency_key,
            status_code=200,
            body=view,
        )
    return JSONResponse(view, headers={"ETag": view["etag"]})


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
    conn: ConnDep,
    request: Request,
    body: Annotated[StatusChange | None, Body()] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Set the pool CORDONED: existing leases keep running, new placements skip the pool.
    For the pool's operators (and admins); the body is optional."""
    return await _status_action(
        operation="cordonPool",
        status=PoolStatus.CORDONED,
        pool_id=pool_id,
        body=body,
        principal=principal,
        conn=conn,
        request=request,
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
    conn: ConnDep,
    request: Request,
    body: Annotated[DrainRequest | None, Body()] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Set the pool DRAINING: new placements skip it and `drainProgress.leasesLeft` counts
    the leases still running. When the optional deadline passes, the remaining leases are
    revoked and their tasks requeued. For the pool's operators (and admins)."""
    return await _status_action(
        operation="drainPool",
        status=PoolStatus.DRAINING,
        pool_id=pool_id,
        body=body,
        principal=principal,
        conn=conn,
        request=request,
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
    conn: ConnDep,
    request: Request,
    body: Annotated[StatusChange | None, Body()] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Set the pool ACTIVE (clearing any drain deadline) and wake pending tasks that may now
    fit. For the pool's operators (and admins); the body is optional."""
    return await _status_action(
        operation="activatePool",
        status=PoolStatus.ACTIVE,
        pool_id=pool_id,
        body=body,
        principal=principal,
        conn=conn,
        request=request,
        idempotency_key=idempotency_key,
    )

