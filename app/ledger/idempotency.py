"""Idempotency-Key records: a retried request gets the first answer, not a second effect.

A record is keyed by (API key id, operation, Idempotency-Key) and stores the hash of the
request and the response it got: two API keys never share records, even when they belong to
the same subject. Records older than the retention are deleted in batches by the
reconciler's leader (:func:`idempotency_records_expire`).

The protocol runs inside the operation's transaction (see
:func:`app.services.idempotency.idempotent`):

1. :func:`idempotency_claim` inserts a placeholder with ``ON CONFLICT DO NOTHING``. When
   the insert wins, the caller owns the key: it performs the operation and stores the
   answer with :func:`idempotency_store` before committing.
2. When the key exists, the stored record is read back: the same request hash replays the
   stored response; a different hash is 409.

A concurrent duplicate blocks on the primary key of the first request's uncommitted insert
until that transaction ends; after a commit it reads the stored answer, after a rollback
its own insert wins and it performs the operation itself. So exactly one request has the
effect, whatever the interleaving.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db import Connection
from app.errors import Conflict

__all__ = [
    "IdempotencyKeyReused",
    "StoredResponse",
    "idempotency_claim",
    "idempotency_records_expire",
    "idempotency_store",
]

#: Status of a placeholder whose owner has not stored its answer yet (never committed).
_PENDING = 0

_CLAIM = """
    INSERT INTO idempotency_records (key_id, operation, key, request_hash, status_code, response)
    VALUES ($1, $2, $3, $4, $5, '{}'::jsonb)
    ON CONFLICT (key_id, operation, key) DO NOTHING
    RETURNING key
"""

_STORED = """
    SELECT request_hash, status_code, response FROM idempotency_records
    WHERE key_id = $1 AND operation = $2 AND key = $3
"""

_STORE = """
    UPDATE idempotency_records SET status_code = $4, response = $5
    WHERE key_id = $1 AND operation = $2 AND key = $3
"""

#: One batch of expired records, oldest first (by ``ix_idempotency_records_created_at``).
_EXPIRE = """
    DELETE FROM idempotency_records
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM idempotency_records WHERE created_at < $1
        ORDER BY created_at LIMIT $2
        FOR UPDATE SKIP LOCKED
    ))
"""


class IdempotencyKeyReused(Conflict):
    """This Idempotency-Key was already used with a different request."""

    type_slug = "idempotency-key-reused"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """The answer first given to a request with this key."""

    status_code: int
    body: Any


async def idempotency_claim(
    conn: Connection, *, key_id: uuid.UUID, operation: str, key: str, request_hash: str
) -> StoredResponse | None:
    """Claim ``key`` for this request and return None, or return the stored response of an
    earlier identical request; raise IdempotencyKeyReused for a different one."""
    inserted = await conn.fetchval(_CLAIM, key_id, operation, key, request_hash, _PENDING)
    if inserted is not None:
        return None
    row = await conn.fetchrow(_STORED, key_id, operation, key)
    if row is None or row["request_hash"] != request_hash:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used for a different {operation} request; "
            "use a new key for a new request"
        )
    return StoredResponse(status_code=row["status_code"], body=row["response"])


async def idempotency_store(
    conn: Connection,
    *,
    key_id: uuid.UUID,
    operation: str,
    key: str,
    status_code: int,
    body: Any,
) -> None:
    """Store the response of the request that claimed ``key``."""
    await conn.execute(_STORE, key_id, operation, key, status_code, body)


async def idempotency_records_expire(conn: Connection, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` records created before ``before``; return how many.

    Rows another transaction holds (a request in progress) are skipped, not waited for.
    """
    status = await conn.execute(_EXPIRE, before, limit)
    return int(status.split()[-1])
