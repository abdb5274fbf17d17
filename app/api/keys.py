"""HTTP API: keys — list, create and revoke API keys (admin only).

The secret ``key`` appears in the createKey answer and nowhere else; lists show its
non-secret ``prefix`` (the first characters of the key) so that an operator can tell keys
apart. A revoked key stops working within the key cache window (docs/api.md#keys).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import ConfigDict, Field

from app.api.bodies import StrictRoute
from app.api.common import (
    CamelModel,
    CursorQuery,
    LimitQuery,
    Page,
    RequestModel,
    cursor_decode,
    cursor_encode,
)
from app.api.common import problems as problem_responses
from app.auth import AdminDep
from app.errors import BadRequest
from app.ledger.keys import ApiKeyNotFound, ApiKeyRow
from app.services import keys as service
from app.services.tokens import Tokens

router = APIRouter(prefix="/v1", tags=["keys"], route_class=StrictRoute)

_ID = Annotated[str, Field(min_length=1, max_length=128)]

KeyIdPath = Annotated[
    str, Path(alias="keyId", max_length=64, description="The key's id (a UUID).")
]


class ApiKeyCreate(RequestModel):
    """A new key: its role, who it belongs to, and what it acts for."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"role": "tenant", "subject": "acme-ci", "tenantIds": ["acme"]}]
        }
    )

    role: Literal["admin", "operator", "tenant", "runtime"]
    subject: str = Field(min_length=1, max_length=200, description="Who the key belongs to.")
    tenant_ids: list[_ID] = Field(
        default_factory=list,
        max_length=100,
        description="Tenants the key acts for: at least one for a tenant key; an operator "
        "key may read for tenants too.",
    )
    runtime_instance_ids: list[_ID] = Field(
        default_factory=list,
        max_length=100,
        description="Runtime instances the key acts for (runtime keys: at least one).",
    )


class ApiKey(CamelModel):
    """A key as listed: never its secret or its hash."""

    id: uuid.UUID
    prefix: str = Field(description="The key's first characters, to tell keys apart.")
    role: Literal["admin", "operator", "tenant", "runtime"]
    subject: str
    tenant_ids: list[str]
    runtime_instance_ids: list[str]
    created_at: datetime
    last_used_at: datetime | None = Field(
        description="When the key was last used, recorded at most once a minute."
    )
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiKeyRow) -> ApiKey:
        """Return the API view of a stored key."""
        return cls(
            id=row.id,
            prefix=row.prefix,
            role=row.role,  # type: ignore[arg-type]
            subject=row.subject,
            tenant_ids=list(row.tenant_ids),
            runtime_instance_ids=list(row.runtime_instance_ids),
            created_at=row.created_at,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
        )


class ApiKeyCreated(ApiKey):
    """A new key with its secret, shown only in this answer: store it now."""

    key: str = Field(description="The secret: send it as `Authorization: Bearer <key>`.")


class ApiKeyPage(Page[ApiKey]):
    """One page of keys, oldest first."""


#: The list scope of key cursors.
_SCOPE = "keys"


def _after(tokens: Tokens, cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    if cursor is None:
        return None
    position = cursor_decode(tokens, cursor, scope=_SCOPE)
    try:
        created, key_id = position
        return datetime.fromisoformat(created), uuid.UUID(key_id)
    except (TypeError, ValueError):
        raise BadRequest("the cursor is not valid; pass back the nextCursor of a list") from None


def _key_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiKeyNotFound() from None


@router.get(
    "/keys",
    operation_id="listKeys",
    summary="List API keys",
    response_model=ApiKeyPage,
    responses=problem_responses(400, 401, 403, 422),
)
async def list_keys(
    principal: AdminDep,
    request: Request,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
    include_revoked: Annotated[
        bool, Query(alias="includeRevoked", description="List revoked keys too.")
    ] = True,
) -> ApiKeyPage:
    """List keys oldest first with prefix, role, subject, scopes, creation, last use and
    revocation — never a secret. Admin only."""
    tokens = await request.app.state.tokens.get()
    rows, last = await service.keys_page(
        request.app.state.db, after=_after(tokens, cursor), include_revoked=include_revoked,
        limit=limit,
    )
    return ApiKeyPage(
        items=[ApiKey.of(r) for r in rows],
        next_cursor=cursor_encode(tokens, [last[0].isoformat(), str(last[1])], scope=_SCOPE)
        if last else None,
    )


@router.post(
    "/keys",
    operation_id="createKey",
    summary="Create an API key",
    status_code=201,
    response_model=ApiKeyCreated,
    responses=problem_responses(400, 401, 403, 413, 422),
)
async def create_key(
    body: ApiKeyCreate, principal: AdminDep, request: Request, response: Response
) -> ApiKeyCreated:
    """Create a key; the answer holds its secret `key`, shown only here. Tenant keys need
    `tenantIds`, runtime keys `runtimeInstanceIds`. Admin only."""
    key, row = await service.key_create(
        request.app.state.db,
        principal=principal,
        role=body.role,
        subject=body.subject,
        tenant_ids=body.tenant_ids,
        runtime_instance_ids=body.runtime_instance_ids,
    )
    response.headers["Location"] = f"/v1/keys/{row.id}"
    return ApiKeyCreated(**ApiKey.of(row).model_dump(), key=key)


@router.delete(
    "/keys/{keyId}",
    operation_id="revokeKey",
    summary="Revoke an API key",
    response_model=ApiKey,
    responses=problem_responses(401, 403, 404, 409, 422),
)
async def revoke_key(key_id: KeyIdPath, principal: AdminDep, request: Request) -> ApiKey:
    """Revoke a key: it stops working at once on this process and within the key cache
    window (5 s) on every other. Revoking a revoked key changes nothing; the last live admin
    key cannot be revoked (409). Admin only."""
    row = await service.key_revoke(
        request.app.state.db,
        principal=principal,
        key_id=_key_id(key_id),
        now=datetime.now(UTC),
        cache=request.app.state.key_cache,
    )
    return ApiKey.of(row)
