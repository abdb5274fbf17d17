"""Bearer API keys, principals and role checks.

A key belongs to a subject with one role (admin, operator, tenant, runtime) and the tenant
ids / runtime instance ids it acts for. Keys are stored as sha256 hashes and looked up by
prefix, then their hashes are compared in constant time. Verified keys are cached in
memory for :data:`KEY_CACHE_SECONDS` so that the hot API path does not pay a query per
request: a key revoked through another process (or with SQL) keeps working in a process that
cached it for at most that long; the process that revokes it forgets it at once
(:meth:`KeyCache.forget`). Keys that failed verification are remembered as long
(:class:`KeyRefusals`), so a client repeating a bad key costs no query either. A key's last
use is recorded on a cache miss, at most once a minute (:func:`app.ledger.keys.api_key_used`),
and never fails the request.

Every ``/v1/`` request is authenticated once, from its headers, by the front door
(:mod:`app.api.front_door`, through :func:`principal_verify`) before any of its body is
read; the routes take the principal it verified (:func:`principal_from_request`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.db import Database
from app.errors import Forbidden, Unauthorized
from app.ledger.keys import LAST_USED_PRECISION, ApiKeyRecord, api_key_get, api_key_used

ADMIN, OPERATOR, TENANT, RUNTIME = "admin", "operator", "tenant", "runtime"

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")

#: How long a process trusts a verified key without asking the database again: the most a
#: revoked key keeps working in another API process (docs/api.md#keys).
KEY_CACHE_SECONDS = 5.0
#: Most keys cached at once.
KEY_CACHE_SIZE = 10_000
#: Most refused key hashes remembered at once.
KEY_REFUSALS_SIZE = 10_000
#: Where the front door leaves the verified principal in the ASGI scope.
PRINCIPAL_SCOPE_KEY = "berth.principal"

log = logging.getLogger("berth.auth")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: subject, role and what it acts for."""

    subject: str
    role: str
    tenant_ids: frozenset[str]
    runtime_instance_ids: frozenset[str]
    #: The API key's id: what idempotency records are scoped by.
    key_id: uuid.UUID | None = None

    @classmethod
    def from_record(cls, record: ApiKeyRecord) -> Principal:
        """Build a principal from a stored key record."""
        return cls(
            key_id=record.id,
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
    """Verified keys by hash, for ``ttl_seconds``; a revoked key stops working within that TTL.

    ``clock`` (monotonic seconds) is injectable so that tests can pass the TTL without
    sleeping.
    """

    def __init__(
        self,
        ttl_seconds: float = KEY_CACHE_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl_seconds
        self.clock = clock
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, digest: str, now: float) -> Principal | None:
        """Return the cached principal of ``digest`` if still fresh."""
        entry = self._entries.get(digest)
        if entry is None or entry[0] < now:
            return None
        return entry[1]

    def known(self, digest: str) -> bool:
        """Return whether ``digest`` was verified here and is still held, fresh or not.

        An expired entry stays until it is evicted or forgotten: a key this process verified
        before is checked again without spending its client's invalid-key budget.
        """
        return digest in self._entries

    def put(self, digest: str, principal: Principal, now: float) -> None:
        """Cache ``principal`` under ``digest``; when full, forget the entry that expires
        first (entries are kept in the order they were put, and all live as long)."""
        entries = self._entries
        entries.pop(digest, None)
        if len(entries) >= KEY_CACHE_SIZE:
            del entries[next(iter(entries))]
        entries[digest] = (now + self.ttl, principal)

    def forget(self, key_id: uuid.UUID) -> None:
        """Drop the cached principal of the key ``key_id`` (it was just revoked here)."""
        for digest, (_, principal) in list(self._entries.items()):
            if principal.key_id == key_id:
                del self._entries[digest]


class KeyRefusals:
    """Hashes of keys that failed verification, each for ``ttl_seconds``; at most
    :data:`KEY_REFUSALS_SIZE` (the oldest go first)."""

    def __init__(self, ttl_seconds: float = KEY_CACHE_SECONDS) -> None:
        self.ttl = ttl_seconds
        self._until: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    def refused(self, digest: str, now: float) -> bool:
        """Return whether ``digest`` failed verification less than the TTL ago."""
        until = self._until.get(digest)
        return until is not None and until >= now

    def put(self, digest: str, now: float) -> None:
        """Remember that ``digest`` failed verification at ``now``."""
        self._until.pop(digest, None)
        self._until[digest] = now + self.ttl
        if len(self._until) > KEY_REFUSALS_SIZE:
            self._until.popitem(last=False)


def header_get(request: Request, name: bytes) -> str | None:
    """Return the first value of the request header ``name`` (lower case), or None.

    What ``request.headers.get`` answers, without building a lookup key or raising and
    catching a KeyError for a header that was not sent.
    """
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


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


def app_state(request: Request) -> dict[str, Any]:
    """Return the app's state (``app.state``) as the dict Starlette keeps it in.

    ``State`` answers each attribute through ``__getattr__``, after a failed ordinary lookup
    (an AttributeError raised and caught); the hot routes read the dict instead.
    """
    return request.app.state._state  # type: ignore[no-any-return]


def principal_from_request(request: Request) -> Principal:
    """Return the caller's principal, as the front door verified it, or raise 401.

    The ``Depends`` routes reach it through :func:`principal_get`, the lean hot routes call
    it themselves.
    """
    principal: Principal | None = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if principal is None:
        raise Unauthorized(extra={"headers": {"WWW-Authenticate": "Bearer"}})
    return principal


async def principal_verify(
    db: Database, cache: KeyCache, *, key: str, digest: str, now: float
) -> tuple[Principal, ApiKeyRecord] | None:
    """Look ``key`` (whose hash is ``digest``) up in the database: return its principal,
    cached from ``now``, and its record; or None when it is not a live key.

    The key's last use is not recorded here (see :func:`key_use_record`), so that what
    waits on the answer does not wait on that write.
    """
    async with db.connection() as conn:
        record = await api_key_get(conn, key=key)
    if record is None:
        return None
    principal = Principal.from_record(record)
    cache.put(digest, principal, now)
    return principal, record


async def key_use_record(db: Database, record: ApiKeyRecord) -> None:
    """Record the key's use when the recorded one is older than LAST_USED_PRECISION.

    Bookkeeping only: a failure (a busy pool, a database away) is logged and the request
    goes on.
    """
    at = datetime.now(UTC)
    if record.last_used_at is not None and at - record.last_used_at < LAST_USED_PRECISION:
        return
    try:
        async with db.connection() as conn:
            await api_key_used(conn, key_id=record.id, now=at)
    except Exception as exc:
        log.warning("could not record a key's last use",
                    extra={"key_id": str(record.id), "error": type(exc).__name__})


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
    read by the front door.
    """
    return principal_from_request(request)


PrincipalDep = Annotated[Principal, Depends(principal_get)]


def require_roles(*roles: str):  # type: ignore[no-untyped-def]
    """Return a dependency that admits only principals with one of ``roles`` (else 403)."""

    async def _check(principal: PrincipalDep) -> Principal:
        return role_check(principal, *roles)

    return Depends(_check)


AdminDep = Annotated[Principal, require_roles(ADMIN)]
TenantDep = Annotated[Principal, require_roles(TENANT)]
RuntimeDep = Annotated[Principal, require_roles(RUNTIME)]
