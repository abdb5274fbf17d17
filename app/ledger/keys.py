"""API keys: stored as sha256 hashes; the key itself is shown once and never stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from app.db import Connection

__all__ = [
    "KEY_PREFIX",
    "ApiKeyRecord",
    "api_key_bootstrap",
    "api_key_create",
    "api_key_get",
    "key_generate",
    "key_hash",
    "key_prefix",
]

KEY_PREFIX = "berth_"

_CREATE = """
    INSERT INTO api_keys (id, key_hash, prefix, subject, role, tenant_ids, runtime_instance_ids,
                          bootstrap)
    VALUES ($1, $2, $3, $4, $5, $6::text[], $7::text[], $8)
"""

_BOOTSTRAP_EXISTS = "SELECT id FROM api_keys WHERE bootstrap LIMIT 1"

_BY_PREFIX = """
    SELECT id, key_hash, subject, role, tenant_ids, runtime_instance_ids FROM api_keys
    WHERE prefix = $1 AND revoked_at IS NULL
"""


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """A stored key's owner: subject, role and the tenants / runtime instances it acts for."""

    id: uuid.UUID
    subject: str
    role: str
    tenant_ids: tuple[str, ...]
    runtime_instance_ids: tuple[str, ...]


def key_hash(key: str) -> str:
    """Return the stored hash of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """Return the non-secret prefix a key is looked up by."""
    return key[: len(KEY_PREFIX) + 8]


def key_generate() -> str:
    """Return a new random API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


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
    key = key or key_generate()
    await conn.execute(
        _CREATE,
        uuid.uuid4(),
        key_hash(key),
        key_prefix(key),
        subject,
        role,
        list(tenant_ids),
        list(runtime_instance_ids),
        bootstrap,
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
    )
