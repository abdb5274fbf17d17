"""Idempotency-Key records: a retried request gets the first answer, not a second effect.

A record is keyed by (subject, operation, key) and stores the hash of the request and the
response it got. The protocol runs inside the request's transaction:

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

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.errors import Conflict
from app.ledger.tables import idempotency_records

#: Status of a placeholder whose owner has not stored its answer yet (never committed).
_PENDING = 0


class IdempotencyKeyReused(Conflict):
    """This Idempotency-Key was already used with a different request."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """The answer first given to a request with this key."""

    status_code: int
    body: Any


def request_hash(payload: Any) -> str:
    """Return a stable hash of ``payload`` (any JSON value; object keys are sorted)."""
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


async def idempotency_claim(
    conn: AsyncConnection, *, subject: str, operation: str, key: str, request_hash: str
) -> StoredResponse | None:
    """Claim ``key`` for this request and return None, or return the stored response of an
    earlier identical request; raise IdempotencyKeyReused for a different one."""
    inserted = await conn.scalar(
        pg_insert(idempotency_records)
        .values(
            subject=subject,
            operation=operation,
            key=key,
            request_hash=request_hash,
            status_code=_PENDING,
            response={},
        )
        .on_conflict_do_nothing(index_elements=["subject", "operation", "key"])
        .returning(idempotency_records.c.key)
    )
    if inserted is not None:
        return None
    row = (
        await conn.execute(
            select(
                idempotency_records.c.request_hash,
                idempotency_records.c.status_code,
                idempotency_records.c.response,
            ).where(
                idempotency_records.c.subject == subject,
                idempotency_records.c.operation == operation,
                idempotency_records.c.key == key,
            )
        )
    ).one()
    if row.request_hash != request_hash:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used for a different {operation} request; "
            "use a new key for a new request"
        )
    return StoredResponse(status_code=row.status_code, body=row.response)


async def idempotency_store(
    conn: AsyncConnection,
    *,
    subject: str,
    operation: str,
    key: str,
    status_code: int,
    body: Any,
) -> None:
    """Store the response of the request that claimed ``key``."""
    await conn.execute(
        update(idempotency_records)
        .where(
            idempotency_records.c.subject == subject,
            idempotency_records.c.operation == operation,
            idempotency_records.c.key == key,
        )
        .values(status_code=status_code, response=body)
    )
