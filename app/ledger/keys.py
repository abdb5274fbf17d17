"""API keys: stored as sha256 hashes; the key itself is shown once and never stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.ledger.tables import api_keys

KEY_PREFIX = "berth_"


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
    conn: AsyncConnection,
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
        insert(api_keys).values(
            id=uuid.uuid4(),
            key_hash=key_hash(key),
            prefix=key_prefix(key),
            subject=subject,
            role=role,
            tenant_ids=list(tenant_ids),
            runtime_instance_ids=list(runtime_instance_ids),
            bootstrap=bootstrap,
        )
    )
    return key


async def api_key_bootstrap(conn: AsyncConnection, *, key: str | None = None) -> str | None:
    """Create the bootstrap admin key on a database that has none, and return it; else None.

    The key is ``key`` when given (an operator's, e.g. from a Kubernetes Secret), else a new
    random one. A unique partial index allows one bootstrap key ever, so two processes
    starting at once on a new database cannot both create one.
    """
    exists = await conn.scalar(select(api_keys.c.id).where(api_keys.c.bootstrap).limit(1))
    if exists is not None:
        return None
    try:
        async with conn.begin_nested():
            return await api_key_create(conn, role="admin", subject="bootstrap-admin",
                                        bootstrap=True, key=key)
    except IntegrityError:
        return None


async def api_key_get(conn: AsyncConnection, *, key: str) -> ApiKeyRecord | None:
    """Return the live key record matching ``key``, or None.

    Rows are found by the key's non-secret prefix; the hashes are then compared in constant
    time, so response timing tells nothing about how much of a guessed key was right.
    """
    digest = key_hash(key)
    rows = (
        await conn.execute(
            select(
                api_keys.c.id,
                api_keys.c.key_hash,
                api_keys.c.subject,
                api_keys.c.role,
                api_keys.c.tenant_ids,
                api_keys.c.runtime_instance_ids,
            ).where(api_keys.c.prefix == key_prefix(key), api_keys.c.revoked_at.is_(None))
        )
    ).all()
    row = next((r for r in rows if hmac.compare_digest(r.key_hash, digest)), None)
    if row is None:
        return None
    return ApiKeyRecord(
        id=row.id,
        subject=row.subject,
        role=row.role,
        tenant_ids=tuple(row.tenant_ids),
        runtime_instance_ids=tuple(row.runtime_instance_ids),
    )
