"""API keys: stored as sha256 hashes; the key itself is shown once and never stored.

A key is looked up by its non-secret prefix and verified by hash (:func:`api_key_get`);
listed without its hash (:func:`api_keys_list`); revoked by id (:func:`api_key_revoke`), which
refuses to revoke the last live admin key; and its last use is recorded at most once per
:data:`LAST_USED_PRECISION` (:func:`api_key_used`), so a busy key costs no write per request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from app.db import Connection
from app.errors import Conflict, NotFound

__all__ = [
    "KEY_PREFIX",
    "LAST_USED_PRECISION",
    "ApiKeyNotFound",
    "ApiKeyRecord",
    "ApiKeyRow",
    "LastAdminKey",
    "api_key_bootstrap",
    "api_key_create",
    "api_key_get",
    "api_key_issue",
    "api_key_revoke",
    "api_key_used",
    "api_keys_list",
    "key_generate",
    "key_hash",
    "key_prefix",
]

KEY_PREFIX = "berth_"

#: A key's recorded last use is at most this much older than its real last use.
LAST_USED_PRECISION = timedelta(minutes=1)

#: The columns of a listed key: never its hash.
_ROW = """id, prefix, role, subject, tenant_ids, runtime_instance_ids, created_at, last_used_at,
          revoked_at"""

_CREATE = f"""
    INSERT INTO api_keys (id, key_hash, prefix, subject, role, tenant_ids, runtime_instance_ids,
                          bootstrap, created_at)
    VALUES ($1, $2, $3, $4, $5, $6::text[], $7::text[], $8, coalesce($9, now()))
    RETURNING {_ROW}
"""

_BOOTSTRAP_EXISTS = "SELECT id FROM api_keys WHERE bootstrap LIMIT 1"

_BY_PREFIX = """
    SELECT id, key_hash, subject, role, tenant_ids, runtime_instance_ids, last_used_at
    FROM api_keys
    WHERE prefix = $1 AND revoked_at IS NULL
"""

_LIST = f"""
    SELECT {_ROW} FROM api_keys
    WHERE ($1::timestamptz IS NULL OR (created_at, id) > ($1, $2::uuid))
      AND ($3::boolean OR revoked_at IS NULL)
    ORDER BY created_at, id
    LIMIT $4
"""

_GET_ROW = f"SELECT {_ROW} FROM api_keys WHERE id = $1"

#: Every live admin key, locked in id order: two revocations of admin keys serialise here,
#: so they cannot both see another live admin and revoke the last two together.
_ADMINS_LOCK = """
    SELECT id FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL ORDER BY id FOR UPDATE
"""

_REVOKE = f"""
    UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL RETURNING {_ROW}
"""

_USED = """
    UPDATE api_keys SET last_used_at = $2
    WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $3)
"""


class ApiKeyNotFound(NotFound):
    """No API key has this id."""

    type_slug = "key-not-found"


class LastAdminKey(Conflict):
    """This is the last live admin key: create another admin key before revoking it."""

    type_slug = "last-admin-key"


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """A stored key's owner: subject, role and the tenants / runtime instances it acts for."""

    id: uuid.UUID
    subject: str
    role: str
    tenant_ids: tuple[str, ...]
    runtime_instance_ids: tuple[str, ...]
    last_used_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ApiKeyRow:
    """A key as listed: everything but its hash (the key itself is never stored)."""

    id: uuid.UUID
    prefix: str
    role: str
    subject: str
    tenant_ids: tuple[str, ...]
    runtime_instance_ids: tuple[str, ...]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


def _key_row(row: asyncpg.Record) -> ApiKeyRow:
    return ApiKeyRow(
        id=row["id"],
        prefix=row["prefix"],
        role=row["role"],
        subject=row["subject"],
        tenant_ids=tuple(row["tenant_ids"]),
        runtime_instance_ids=tuple(row["runtime_instance_ids"]),
        created_at=row["created_at"],
        last_used_at=row["last_used_at"],
        revoked_at=row["revoked_at"],
    )


def key_hash(key: str) -> str:
    """Return the stored hash of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """Return the non-secret prefix a key is looked up by."""
    return key[: len(KEY_PREFIX) + 8]


def key_generate() -> str:
    """Return a new random API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


async def api_key_issue(
    conn: Connection,
    *,
    role: str,
    subject: str,
    tenant_ids: Sequence[str] = (),
    runtime_instance_ids: Sequence[str] = (),
    bootstrap: bool = False,
    key: str | None = None,
    now: datetime | None = None,
) -> tuple[str, ApiKeyRow]:
    """Store ``key`` (else a new random key) for ``subject`` as its hash; return the key and
    its stored row."""
    key = key or key_generate()
    row = await conn.fetchrow(
        _CREATE,
        uuid.uuid4(),
        key_hash(key),
        key_prefix(key),
        subject,
        role,
        list(tenant_ids),
        list(runtime_instance_ids),
        bootstrap,
        now,
    )
    return key, _key_row(row)


async def api_key_create(
    conn: Connection,
    *,
    role: str,
    subject: str,
    tenant_ids: Sequence[str] = (),
    runtime_instance_ids: Sequence[str] = (),
    bootstrap: bool = False,
    key: str | None = None,
) -> str:
    """Store ``key`` (else a new random key) for ``subject`` as its hash; return the key."""
    key, _ = await api_key_issue(
        conn,
        role=role,
        subject=subject,
        tenant_ids=tenant_ids,
        runtime_instance_ids=runtime_instance_ids,
        bootstrap=bootstrap,
        key=key,
    )
    return key


async def api_key_bootstrap(conn: Connection, *, key: str | None = None) -> str | None:
    """Create the bootstrap admin key on a database that has none, and return it; else None.

    The key is ``key`` when given (an operator's, e.g. from a Kubernetes Secret), else a new
    random one. A unique partial index allows one bootstrap key ever, so two processes
    starting at once on a new database cannot both create one. The insert runs in a block of
    its own (a savepoint inside the caller's transaction), so losing that race leaves the
    caller's transaction usable.
    """
    if await conn.fetchval(_BOOTSTRAP_EXISTS) is not None:
        return None
    try:
        async with conn.transaction():
            return await api_key_create(
                conn, role="admin", subject="bootstrap-admin", bootstrap=True, key=key
            )
    except asyncpg.UniqueViolationError:
        return None


async def api_key_get(conn: Connection, *, key: str) -> ApiKeyRecord | None:
    """Return the live key record matching ``key``, or None.

    Rows are found by the key's non-secret prefix; the hashes are then compared in constant
    time, so response timing tells nothing about how much of a guessed key was right.
    """
    digest = key_hash(key)
    rows = await conn.fetch(_BY_PREFIX, key_prefix(key))
    row = next((r for r in rows if hmac.compare_digest(r["key_hash"], digest)), None)
    if row is None:
        return None
    return ApiKeyRecord(
        id=row["id"],
        subject=row["subject"],
        role=row["role"],
        tenant_ids=tuple(row["tenant_ids"]),
        runtime_instance_ids=tuple(row["runtime_instance_ids"]),
        last_used_at=row["last_used_at"],
    )


async def api_keys_list(
    conn: Connection,
    *,
    after: tuple[datetime, uuid.UUID] | None,
    include_revoked: bool,
    limit: int,
) -> tuple[list[ApiKeyRow], tuple[datetime, uuid.UUID] | None]:
    """Return a page of keys in creation order and the (created_at, id) the next starts after."""
    created, key_id = after if after is not None else (None, None)
    rows = await conn.fetch(_LIST, created, key_id, include_revoked, limit + 1)
    keys = [_key_row(r) for r in rows[:limit]]
    if len(rows) > limit:
        return keys, (keys[-1].created_at, keys[-1].id)
    return keys, None


async def api_key_revoke(conn: Connection, *, key_id: uuid.UUID, now: datetime) -> ApiKeyRow:
    """Revoke the key ``key_id`` and return it (a revoked key is returned unchanged).

    Raises ApiKeyNotFound for an unknown id and LastAdminKey when the key is the last live
    admin key. Run it in a transaction: the admin keys stay locked until it commits.
    """
    current = await conn.fetchrow(_GET_ROW, key_id)
    if current is None:
        raise ApiKeyNotFound()
    if current["revoked_at"] is not None:
        return _key_row(current)
    if current["role"] == "admin":
        admins = [r["id"] for r in await conn.fetch(_ADMINS_LOCK)]
        if key_id in admins and len(admins) <= 1:
            raise LastAdminKey()
    row = await conn.fetchrow(_REVOKE, key_id, now)
    if row is None:  # revoked by a concurrent request meanwhile
        row = await conn.fetchrow(_GET_ROW, key_id)
    return _key_row(row)


async def api_key_used(conn: Connection, *, key_id: uuid.UUID, now: datetime) -> bool:
    """Record that ``key_id`` was used at ``now`` unless a use within LAST_USED_PRECISION is
    recorded already; return whether a row was written."""
    status = await conn.execute(_USED, key_id, now, now - LAST_USED_PRECISION)
    return status.endswith(" 1")
