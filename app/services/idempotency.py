"""Idempotency-Key handling for every write that supports it, in one place.

Inside the operation's transaction: claim the key (a placeholder row), perform the operation,
store its answer; the COMMIT makes both durable together. Records belong to the API key that
sent the request (its id, not its subject), so one key never replays another's answer; and
the service authorizes a request before it looks for a stored answer, so a replay is
authorized exactly like a first request. Records expire after
``BERTH_IDEMPOTENCY_RETENTION_HOURS`` (the reconciler leader sweeps them).

A repeat with the same request replays the stored answer (marked ``replayed``); the same key
with another request is 409.
See :mod:`app.ledger.idempotency` for how concurrent duplicates settle.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.db import Connection
from app.ledger.idempotency import idempotency_claim, idempotency_store

__all__ = ["Answer", "Idempotency", "idempotent", "request_hash"]


def request_hash(payload: Any) -> str:
    """Return a stable hash of ``payload`` (any JSON value; object keys are sorted)."""
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class Idempotency:
    """An Idempotency-Key as one API key sent it for one operation and request."""

    key_id: uuid.UUID
    operation: str
    key: str
    request_hash: str


@dataclass(frozen=True, slots=True)
class Answer:
    """An operation's answer as the API sends it: status, JSON body and extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    replayed: bool = False


async def idempotent(
    conn: Connection,
    idempotency: Idempotency | None,
    perform: Callable[[], Awaitable[Answer]],
) -> Answer:
    """Return ``perform()``'s answer, or the stored answer of an identical earlier request.

    Must run inside the operation's transaction (``conn``), so that the stored answer and
    the operation's effect commit together.
    """
    if idempotency is None:
        return await perform()
    stored = await idempotency_claim(
        conn,
        key_id=idempotency.key_id,
        operation=idempotency.operation,
        key=idempotency.key,
        request_hash=idempotency.request_hash,
    )
    if stored is not None:
        body = stored.body
        headers = dict(body.pop("__headers__", {})) if isinstance(body, dict) else {}
        return Answer(stored.status_code, body, headers, replayed=True)
    answer = await perform()
    body = answer.body
    if answer.headers and isinstance(body, dict):
        body = {**body, "__headers__": answer.headers}
    await idempotency_store(
        conn,
        key_id=idempotency.key_id,
        operation=idempotency.operation,
        key=idempotency.key,
        status_code=answer.status,
        body=body,
    )
    return answer
