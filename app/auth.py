"""Bearer API keys, principals and role checks.

A key belongs to a subject with one role (admin, operator, tenant, runtime) and the tenant
ids / runtime instance ids it acts for. Keys are stored as sha256 hashes and looked up by
prefix, then their hashes are compared in constant time. Verified keys are cached in
memory for a few seconds so that the hot API path does not pay a query per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.errors import Forbidden, Unauthorized
from app.ledger.keys import ApiKeyRecord, api_key_get, key_hash

ADMIN, OPERATOR, TENANT, RUNTIME = "admin", "operator", "tenant", "runtime"

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")

_CACHE_TTL_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: subject, role and what it acts for."""

    subject: str
    role: str
    tenant_ids: frozenset[str]
    runtime_instance_ids: frozenset[str]

    @classmethod
    def from_record(cls, record: ApiKeyRecord) -> Principal:
        """Build a principal from a stored key record."""
        return cls(
            subject=record.subject,
            role=record.role,
            tenant_ids=frozenset(record.tenant_ids),
            runtime_instance_ids=frozenset(record.runtime_instance_ids),
        )

    @property
    def tenant_id(self) -> str:
        """Return the tenant a tenant key acts for (its first, for single-tenant keys)."""
        if not self.tenant_ids:
            raise Forbidden("this key acts for no tenant")
        return min(self.tenant_ids)


class KeyCache:
    """Verified keys by hash, for a few seconds; a revoked key stops working within that TTL."""

    def __init__(self, ttl_seconds: float = _CACHE_TTL_SECONDS) -> None:
        self.ttl = ttl_seconds
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, digest: str, now: float) -> Principal | None:
        """Return the cached principal of ``digest`` if still fresh."""
        entry = self._entries.get(digest)
        if entry is None or entry[0] < now:
            return None
        return entry[1]

    def put(self, digest: str, principal: Principal, now: float) -> None:
        """Cache ``principal`` under ``digest``."""
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[digest] = (now + self.ttl, principal)


def bearer_key(authorization: str | None) -> str | None:
    """Return the key of an ``Authorization: Bearer <key>`` header value, or None.

    The same reading as FastAPI's ``HTTPBearer``: scheme, one space, the key (stripped).
    """
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if not scheme or not key or scheme.lower() != "bearer":
        return None
    return key


async def principal_from_request(request: Request) -> Principal:
    """Return the caller's principal (cached for a few seconds), or raise 401.

    The one place a request's key is read and verified: the ``Depends`` routes reach it
    through :func:`principal_get`, the lean hot routes call it themselves.
    """
    key = bearer_key(request.headers.get("authorization"))
    if key is None:
        raise Unauthorized(extra={"headers": {"WWW-Authenticate": "Bearer"}})
    digest = key_hash(key)
    cache: KeyCache = request.app.state.key_cache
    now = time.monotonic()
    principal = cache.get(digest, now)
    if principal is not None:
        return principal
    async with request.app.state.db.connection() as conn:
        record = await api_key_get(conn, key=key)
    if record is None:
        raise Unauthorized(
            "the API key is not valid", extra={"headers": {"WWW-Authenticate": "Bearer"}}
        )
    principal = Principal.from_record(record)
    cache.put(digest, principal, now)
    return principal


def role_check(principal: Principal, *roles: str) -> Principal:
    """Return ``principal`` if its role is one of ``roles``, else raise 403."""
    if principal.role not in roles:
        raise Forbidden(f"this operation needs the {' or '.join(roles)} role")
    return principal


async def principal_get(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """Return the caller's principal, or raise 401 for a missing or unknown key.

    ``credentials`` only declares the bearer scheme in the OpenAPI document; the header is
    read by :func:`principal_from_request`.
    """
    return await principal_from_request(request)


PrincipalDep = Annotated[Principal, Depends(principal_get)]


def require_roles(*roles: str):  # type: ignore[no-untyped-def]
    """Return a dependency that admits only principals with one of ``roles`` (else 403)."""

    async def _check(principal: PrincipalDep) -> Principal:
        return role_check(principal, *roles)

    return Depends(_check)


AdminDep = Annotated[Principal, require_roles(ADMIN)]
TenantDep = Annotated[Principal, require_roles(TENANT)]
RuntimeDep = Annotated[Principal, require_roles(RUNTIME)]
