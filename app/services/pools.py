"""Pools: every pool operation as one function that owns its transaction.

Who may do what: an admin manages pools and their capacity; any caller reads the
pools visible to it (the visibility predicate of :mod:`app.ledger.pools`); the operators
named in a pool's ``operators`` cordon, drain and activate it. An admin may run the status
actions too: the admin already owns every other change to a pool, and an operator who is
unreachable must not leave a pool stuck. A pool the caller cannot see answers 404, never
403, so its existence is not revealed; a visible pool the caller may not operate answers 403.

The admin-only operations are gated on the route (``AdminDep``), so a caller without the
role is refused before its body is read; what depends on the pool itself — visibility and
operator authority — is decided here, inside the transaction that acts on it.

Each write commits before its function returns and logs only after the commit, so a log
line never announces a change that did not happen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic_core import to_jsonable_python

from app.auth import ADMIN, OPERATOR, RUNTIME, Principal
from app.db import Connection, Database
from app.errors import Forbidden, Unprocessable
from app.ledger.pools import (
    PoolNotFound,
    PoolRecord,
    PoolVersionMismatch,
    PoolViewer,
    pool_capacity_put,
    pool_create,
    pool_delete,
    pool_get,
    pool_status_set,
    pool_update,
    pools_list,
    pools_tenant_usage,
)
from app.services.idempotency import Answer, Idempotency, idempotent, request_hash

__all__ = [
    "MAX_LABELS",
    "change_pool_status",
    "create_pool",
    "delete_pool",
    "get_pool",
    "list_pools",
    "pool_operated",
    "pool_viewer",
    "put_pool_capacity",
    "update_pool",
]

#: The most labels one pool may carry (after a PATCH merges its changes in).
MAX_LABELS = 32

# The logger keeps the name its lines have always had, so existing log filters still match.
log = logging.getLogger("berth.api.pools")

#: Renders a pool as the caller sees it, for an answer stored with its Idempotency-Key.
PoolRender = Callable[[PoolRecord], dict[str, Any]]


def pool_viewer(principal: Principal) -> PoolViewer:
    """Return the pool viewer a principal reads pools as."""
    return PoolViewer(
        role=principal.role,
        subject=principal.subject,
        tenant_ids=principal.tenant_ids,
        runtime_instance_ids=principal.runtime_instance_ids,
    )


def _operable(record: PoolRecord, viewer: PoolViewer) -> bool:
    return viewer.role == ADMIN or (viewer.role == OPERATOR and viewer.subject in record.operators)


def usage_total_visible(record: PoolRecord, viewer: PoolViewer) -> bool:
    """Return whether ``viewer`` reads the pool's total usage (else only its tenants')."""
    return _operable(record, viewer) or (
        viewer.role == RUNTIME and record.runtime_instance_id in viewer.runtime_instance_ids
    )


async def _usage_scoped(
    conn: Connection, records: list[PoolRecord], viewer: PoolViewer
) -> list[PoolRecord]:
    """Return ``records`` with the usage ``viewer`` may read: totals, or its tenants' own."""
    own = [r.id for r in records if not usage_total_visible(r, viewer)]
    if not own:
        return records
    usage = await pools_tenant_usage(conn, pool_ids=own, tenant_ids=viewer.tenant_ids)
    return [r if r.id not in usage else r.usage_own(usage[r.id]) for r in records]


async def pool_operated(
    conn: Connection, *, viewer: PoolViewer, pool_id: str, action: str
) -> PoolRecord:
    """Return the pool ``viewer`` operates; 404 when it cannot see it, 403 when it sees it but
    is neither one of its operators nor an admin (``action`` says what it was refused)."""
    record = await pool_get(conn, pool_id=pool_id, viewer=viewer)
    if record is None:
        raise PoolNotFound()
    if not _operable(record, viewer):
        raise Forbidden(f"only the pool's operators (or an admin) may {action} it")
    return record


async def create_pool(
    db: Database, *, principal: Principal, pool_id: str, fields: Mapping[str, Any], now: datetime
) -> PoolRecord:
    """Create a pool (status ACTIVE, no ledger yet) and return it; 409 if the id exists."""
    async with db.transaction() as conn:
        record = await pool_create(conn, pool_id=pool_id, fields=fields, now=now)
    log.info("pool created", extra={"pool_id": pool_id, "subject": principal.subject})
    return record


async def list_pools(
    db: Database,
    *,
    principal: Principal,
    limit: int,
    after: str | None,
    status: str | None,
    runtime_class: str | None,
) -> tuple[list[PoolRecord], str | None]:
    """Return one page of the pools visible to ``principal`` and the id the next page
    starts after (None on the last page)."""
    viewer = pool_viewer(principal)
    async with db.connection() as conn:
        records, last = await pools_list(
            conn,
            viewer=viewer,
            limit=limit,
            after=after,
            status=status,
            runtime_class=runtime_class,
        )
        return await _usage_scoped(conn, records, viewer), last


async def get_pool(db: Database, *, principal: Principal, pool_id: str) -> PoolRecord:
    """Return the pool ``pool_id``; 404 when it does not exist or ``principal`` cannot see
    it."""
    viewer = pool_viewer(principal)
    async with db.connection() as conn:
        record = await pool_get(conn, pool_id=pool_id, viewer=viewer)
        if record is None:
            raise PoolNotFound()
        (record,) = await _usage_scoped(conn, [record], viewer)
    return record


async def update_pool(
    db: Database,
    *,
    principal: Principal,
    pool_id: str,
    changes: Mapping[str, Any],
    label_changes: Mapping[str, str | None],
    accepted_versions: set[int] | None,
    now: datetime,
) -> PoolRecord:
    """Apply a merge patch to the pool and return it; 412 when its version is not one of
    ``accepted_versions`` (the If-Match header; None accepts any), 422 when the merged
    labels exceed MAX_LABELS — either way nothing changes."""
    async with db.transaction() as conn:
        expected = None
        if accepted_versions is not None:
            current = await pool_get(conn, pool_id=pool_id)
            if current is None:
                raise PoolNotFound()
            if current.version not in accepted_versions:
                raise PoolVersionMismatch()
            expected = current.version
        if not changes and not label_changes:
            record = await pool_get(conn, pool_id=pool_id)
            if record is None:
                raise PoolNotFound()
            return record
        record = await pool_update(
            conn,
            pool_id=pool_id,
            changes=changes,
            label_changes=label_changes,
            expected_version=expected,
            now=now,
        )
        if len(record.labels) > MAX_LABELS:
            # Raised inside the block, so the merge is rolled back.
            raise Unprocessable(
                f"labels: a pool has at most {MAX_LABELS} labels",
                extra={"errors": [{"loc": ["body", "labels"], "msg": "too many labels"}]},
            )
    log.info(
        "pool updated",
        extra={"pool_id": pool_id, "subject": principal.subject, "version": record.version},
    )
    return record


async def delete_pool(db: Database, *, principal: Principal, pool_id: str) -> None:
    """Delete the pool, its ledger and its lease history; 409 while a lease or reservation
    still holds capacity on it."""
    async with db.transaction() as conn:
        await pool_delete(conn, pool_id=pool_id)
    log.info("pool deleted", extra={"pool_id": pool_id, "subject": principal.subject})


async def put_pool_capacity(
    db: Database,
    *,
    principal: Principal,
    pool_id: str,
    totals: tuple[int, int, int],
    now: datetime,
) -> PoolRecord:
    """Register or change the pool's ledger totals and return the pool; 409 naming the
    dimension when a total would fall below what is reserved now."""
    async with db.transaction() as conn:
        record = await pool_capacity_put(conn, pool_id=pool_id, totals=totals, now=now)
    log.info(
        "pool capacity set",
        extra={"pool_id": pool_id, "subject": principal.subject, "totals": totals},
    )
    return record


async def change_pool_status(
    db: Database,
    *,
    principal: Principal,
    operation: str,
    pool_id: str,
    status: str,
    reason: str | None,
    deadline: datetime | None,
    idempotency_key: str | None,
    render: PoolRender,
    now: datetime,
) -> Answer:
    """Set the pool's status (the ``operation`` cordonPool, drainPool or activatePool) and
    return the answer: the pool as ``render`` shows it, with its ETag — or, for a repeated
    Idempotency-Key, the first answer, replayed."""
    viewer = pool_viewer(principal)
    idempotency = None
    if idempotency_key is not None:
        body = {"reason": reason, "deadline": to_jsonable_python(deadline)}
        digest = request_hash(
            {"poolId": pool_id, "body": {k: v for k, v in body.items() if v is not None}}
        )
        assert principal.key_id is not None
        idempotency = Idempotency(
            key_id=principal.key_id, operation=operation, key=idempotency_key,
            request_hash=digest,
        )

    async with db.transaction() as conn:
        await pool_operated(conn, viewer=viewer, pool_id=pool_id,
                            action=operation.removesuffix("Pool"))
        if deadline is not None and deadline <= now:
            raise Unprocessable(
                "deadline: a drain deadline must be in the future",
                extra={"errors": [{"loc": ["body", "deadline"], "msg": "must be in the future"}]},
            )

        async def perform() -> Answer:
            changed = await pool_status_set(
                conn,
                pool_id=pool_id,
                status=status,
                reason=reason,
                drain_deadline=deadline,
                now=now,
            )
            view = render(changed)
            return Answer(200, view, {"ETag": view["etag"]})

        answer = await idempotent(conn, idempotency, perform)
    if not answer.replayed:
        log.info(
            "pool status changed",
            extra={
                "pool_id": pool_id,
                "status": status,
                "subject": principal.subject,
                "drain_deadline": deadline.isoformat() if deadline else None,
            },
        )
    return answer
