"""Cohorts: an admin sets a cohort's parent, fair weight and quotas; a tenant key reads the
cohorts on its tenants' paths to the root (another cohort is 404, as if it did not exist).

A cohort's document carries its own numbers only (what its members draw on it, what of it
is borrowed, what of its pool is unused), never a member's. Writes commit before
:func:`cohort_put` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from app.auth import ADMIN, TENANT, Principal, role_check
from app.db import Connection, Database
from app.ledger import cohorts as ledger
from app.ledger.cohorts import (
    CohortNotFound,
    CohortRowSettings,
    cohorts_list,
    cohorts_read,
    cohorts_usage_read,
)
from app.ledger.quotas import RESOURCES
from app.ledger.tenants import Quota, quota_book_read, tenants_read
from app.services.tenancy import tenants_reading

__all__ = ["cohort_delete", "cohort_get", "cohort_put", "cohorts_page"]

async def _documents(
    conn: Connection, rows: list[CohortRowSettings]
) -> list[dict[str, Any]]:
    levels = await cohorts_usage_read(conn, cohort_ids=[r.id for r in rows])
    book = await quota_book_read(conn, runtime_classes={x[1] for x in levels}, tenant_ids=())
    usage: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for c, rc, res, cap, used in levels:
        view = usage.setdefault(c, {}).setdefault(
            rc, {k: dict.fromkeys(RESOURCES, 0) for k in ("used", "borrowed", "lendable")})
        view["used"][res] = int(used)
        view["borrowed"][res] = max(0, int(used) - int(cap))
        view["lendable"][res] = max(0, int(cap) - int(used))
    out = []
    for r in rows:
        nodes = [book.cohort_node(r.id, rc) for rc in usage.get(r.id, {})]
        out.append({
            "id": r.id,
            "parent": r.parent,
            "fairWeight": r.fair_weight,
            "quotas": {
                rc: {res: {"nominal": q.nominal, "borrowingLimit": q.borrowing_limit,
                           "lendingLimit": q.lending_limit} for res, q in by.items()}
                for rc, by in r.quotas.items()
            },
            "usage": usage.get(r.id, {}),
            "share": max((n.share for n in nodes if n is not None), default=0.0),
            "updatedAt": r.updated_at,
        })
    return out


async def _visible(conn: Connection, principal: Principal, tenant: str | None) -> set[str] | None:
    """Return the cohorts a tenant key sees (those on its tenants' paths); None: all."""
    if principal.role == ADMIN and tenant is None:
        return None
    ids = tenants_reading(principal, tenant) if principal.role != ADMIN else {tenant or ""}
    settings = await tenants_read(conn, tenant_ids=ids)
    parents = await ledger.cohorts_parents(conn)
    seen: set[str] = set()
    for row in settings.values():
        cohort: str | None = row.cohort
        while cohort is not None and cohort not in seen:
            seen.add(cohort)
            cohort = parents.get(cohort)
    return seen


async def cohorts_page(
    db: Database, *, principal: Principal, after: str | None, limit: int,
    tenant: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Return a page of cohorts by id and the id the next page starts after: every cohort
    for an admin, those on its tenants' paths for a tenant key (or on the path of the one
    ``tenant``, ``X-Berth-Tenant``, names)."""
    role_check(principal, ADMIN, TENANT)
    async with db.connection() as conn:
        visible = await _visible(conn, principal, tenant)
        if visible is None:
            rows = await cohorts_list(conn, after=after, limit=limit)
        else:
            ids = sorted(c for c in visible if after is None or c > after)[:limit]
            read = await cohorts_read(conn, cohort_ids=ids)
            rows = [read[i] for i in ids if i in read]
        docs = await _documents(conn, rows)
    last = rows[-1].id if len(rows) == limit else None
    return docs, last


async def cohort_get(
    db: Database, *, principal: Principal, cohort_id: str, tenant: str | None = None
) -> dict[str, Any]:
    """Return the cohort with its usage; a tenant key only one on its tenants' paths."""
    role_check(principal, ADMIN, TENANT)
    async with db.connection() as conn:
        visible = await _visible(conn, principal, tenant)
        row = (await cohorts_read(conn, cohort_ids=[cohort_id])).get(cohort_id)
        if row is None or (visible is not None and cohort_id not in visible):
            raise CohortNotFound(f"cohort {cohort_id} does not exist")
        return (await _documents(conn, [row]))[0]


async def cohort_put(
    db: Database, *, principal: Principal, cohort_id: str, parent: str | None,
    fair_weight: float, quotas: Mapping[str, Mapping[str, Quota]], now: datetime,
) -> dict[str, Any]:
    """Replace the cohort's parent, fair weight and quotas (admin only); return it."""
    role_check(principal, ADMIN)
    async with db.transaction() as conn:
        row = await ledger.cohort_put(conn, cohort_id=cohort_id, parent=parent,
                                      fair_weight=fair_weight, quotas=quotas, now=now)
    async with db.connection() as conn:
        return (await _documents(conn, [row]))[0]


async def cohort_delete(
    db: Database, *, principal: Principal, cohort_id: str, now: datetime
) -> None:
    """Delete a cohort without members or children (admin only)."""
    role_check(principal, ADMIN)
    async with db.transaction() as conn:
        await ledger.cohort_delete(conn, cohort_id=cohort_id, now=now)
