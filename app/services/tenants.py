"""Tenants: an admin sets a tenant's cohort, fair weight and quotas; a tenant key reads its
own tenant (and no other's numbers beyond its one ``borrowable`` figure per resource).

A tenant another key asks about is 404 for a tenant key, as if it did not exist; other roles
than admin and tenant are refused (403). Writes commit before :func:`tenant_put` returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from app.auth import ADMIN, TENANT, Principal, role_check
from app.db import Database
from app.ledger import tenants as ledger
from app.ledger.tenants import (
    Quota,
    TenantNotFound,
    TenantRow,
    TenantUsage,
    tenants_list,
    tenants_read,
    tenants_usage,
)
from app.services.tenancy import TenantUnknown, principal_narrowed

__all__ = ["tenant_get", "tenant_put", "tenants_page"]


def _document(row: TenantRow, usage: TenantUsage | None) -> dict[str, Any]:
    return {
        "id": row.id,
        "cohort": row.cohort,
        "fairWeight": row.fair_weight,
        "quotas": {
            rc: {
                res: {"nominal": q.nominal, "borrowingLimit": q.borrowing_limit,
                      "lendingLimit": q.lending_limit}
                for res, q in by_res.items()
            }
            for rc, by_res in row.quotas.items()
        },
        "usage": usage.usage if usage else {},
        "path": list(usage.path) if usage else [row.cohort],
        "share": usage.share if usage else 0.0,
        "updatedAt": row.updated_at,
    }


def _narrowed(principal: Principal, tenant: str | None) -> Principal:
    """Return the principal as ``X-Berth-Tenant`` narrows it: an admin to the one tenant it
    names, a tenant key to that one of its tenants (400 for another)."""
    if tenant is not None and principal.role == ADMIN:
        return dataclasses.replace(principal, role=TENANT, tenant_ids=frozenset((tenant,)))
    return principal_narrowed(principal, tenant)


async def tenants_page(
    db: Database, *, principal: Principal, after: str | None, limit: int,
    tenant: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Return a page of tenants with their usage and the id the next page starts after:
    every configured tenant for an admin, the key's own tenants for a tenant key, only the
    one ``tenant`` (``X-Berth-Tenant``) names when given."""
    role_check(principal, ADMIN, TENANT)
    principal = _narrowed(principal, tenant)
    async with db.connection() as conn:
        if principal.role == ADMIN:
            rows = await tenants_list(conn, after=after, limit=limit)
        else:
            ids = sorted(t for t in principal.tenant_ids if after is None or t > after)[:limit]
            read = await tenants_read(conn, tenant_ids=ids)
            rows = [read[i] for i in ids]
        usage = await tenants_usage(conn, tenants=rows)
    last = rows[-1].id if len(rows) == limit else None
    return [_document(r, usage.get(r.id)) for r in rows], last


async def tenant_get(
    db: Database, *, principal: Principal, tenant_id: str, tenant: str | None = None
) -> dict[str, Any]:
    """Return the tenant with its usage; a tenant key only its own (else 404), and only the
    one ``tenant`` (``X-Berth-Tenant``) names when given."""
    role_check(principal, ADMIN, TENANT)
    principal = _narrowed(principal, tenant)
    if principal.role != ADMIN and tenant_id not in principal.tenant_ids:
        raise TenantNotFound(f"tenant {tenant_id} does not exist")
    async with db.connection() as conn:
        row = (await tenants_read(conn, tenant_ids=[tenant_id]))[tenant_id]
        usage = await tenants_usage(conn, tenants=[row])
    return _document(row, usage.get(tenant_id))


async def tenant_put(
    db: Database,
    *,
    principal: Principal,
    tenant_id: str,
    cohort: str,
    fair_weight: float,
    quotas: Mapping[str, Mapping[str, Quota]],
    now: datetime,
    tenant: str | None = None,
) -> dict[str, Any]:
    """Replace the tenant's cohort, fair weight and quotas (admin only); return the tenant.
    With ``tenant`` (``X-Berth-Tenant``), it must name ``tenant_id`` (else 400)."""
    role_check(principal, ADMIN)
    if tenant is not None and tenant != tenant_id:
        raise TenantUnknown(f"X-Berth-Tenant names {tenant}, the request changes {tenant_id}")
    async with db.transaction() as conn:
        row = await ledger.tenant_put(
            conn, tenant_id=tenant_id, cohort=cohort, fair_weight=fair_weight, quotas=quotas,
            now=now,
        )
    async with db.connection() as conn:
        usage = await tenants_usage(conn, tenants=[row])
    return _document(row, usage.get(tenant_id))
