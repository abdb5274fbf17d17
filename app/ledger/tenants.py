"""Tenants: cohort, fair weight and quotas as an admin set them, and their usage now.

A tenant nobody configured has the defaults (cohort ``default``, fair weight 1, no quota).
Usage is read from the ledger itself: a tenant's usage in a runtime class is the sum of the
reservations of the live leases of its tasks of that class (a preemptor's holds are not
usage); the task's class, not its pool's, so a pool an admin moves to another class takes
nothing charged with it.
What is above the tenant's nominal is borrowed; what it could borrow now is the lendable
quota its cohort has left (the sum over the cohort's other tenants of their unused nominal,
capped by their lending limits, minus what the cohort borrowed), capped by its own
borrowing limit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from app.db import Connection
from app.errors import Conflict, NotFound
from app.ledger.quotas import RESOURCES as QUOTA_RESOURCES
from app.ledger.quotas import quota_usage_rebuild
from app.ledger.wakeups import WakeSource, wakeup_notify

__all__ = [
    "DEFAULT_COHORT",
    "Quota",
    "QuotaBelowUsage",
    "TenantNotFound",
    "TenantRow",
    "tenant_put",
    "tenants_entitlements",
    "tenants_list",
    "tenants_read",
    "tenants_usage",
]

DEFAULT_COHORT = "default"
#: The ledger columns of each resource, in ``QUOTA_RESOURCES`` order.
_COLUMNS = ("cpu", "memory", "llm")


class QuotaBelowUsage(Conflict):
    """A quota's nominal plus borrowing limit would be below what the tenant uses now; lower
    it once the tenant's leases have ended."""

    type_slug = "quota-below-usage"


class TenantNotFound(NotFound):
    """The tenant does not exist."""

    type_slug = "tenant-not-found"


@dataclass(frozen=True, slots=True)
class Quota:
    """One resource's quota in one runtime class."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class TenantRow:
    """A tenant's settings: quotas by runtime class, then resource (API names)."""

    id: str
    cohort: str = DEFAULT_COHORT
    fair_weight: float = 1.0
    quotas: Mapping[str, Mapping[str, Quota]] = field(default_factory=dict)
    updated_at: datetime | None = None


_TENANTS = (
    "SELECT id, cohort, fair_weight, updated_at FROM tenants WHERE id = ANY($1::text[])"
)
_QUOTAS = (
    "SELECT tenant_id, runtime_class, resource, nominal, borrowing_limit, lending_limit "
    "FROM tenant_quotas WHERE tenant_id = ANY($1::text[])"
)


async def tenants_read(conn: Connection, *, tenant_ids: Collection[str]) -> dict[str, TenantRow]:
    """Return the settings of ``tenant_ids``; a tenant without a row has the defaults."""
    ids = sorted(set(tenant_ids))
    rows = {r[0]: r for r in await conn.fetch(_TENANTS, ids)}
    quotas: dict[str, dict[str, dict[str, Quota]]] = {}
    for r in await conn.fetch(_QUOTAS, ids):
        quotas.setdefault(r[0], {}).setdefault(r[1], {})[r[2]] = Quota(
            int(r[3]), None if r[4] is None else int(r[4]), None if r[5] is None else int(r[5])
        )
    out = {}
    for tenant_id in ids:
        row = rows.get(tenant_id)
        out[tenant_id] = TenantRow(
            tenant_id,
            row[1] if row else DEFAULT_COHORT,
            float(row[2]) if row else 1.0,
            quotas.get(tenant_id, {}),
            row[3] if row else None,
        )
    return out


_LIST = "SELECT id FROM tenants WHERE $1::text IS NULL OR id > $1 ORDER BY id LIMIT $2"


async def tenants_list(conn: Connection, *, after: str | None, limit: int) -> list[TenantRow]:
    """Return up to ``limit`` configured tenants with ids after ``after``, by id."""
    ids = [r[0] for r in await conn.fetch(_LIST, after, limit)]
    read = await tenants_read(conn, tenant_ids=ids)
    return [read[i] for i in ids]


_UPSERT = (
    "INSERT INTO tenants (id, cohort, fair_weight, updated_at) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (id) DO UPDATE SET cohort = EXCLUDED.cohort, "
    "fair_weight = EXCLUDED.fair_weight, updated_at = EXCLUDED.updated_at"
)
_QUOTAS_DELETE = "DELETE FROM tenant_quotas WHERE tenant_id = $1"
_CLASSES_OF = (
    "SELECT runtime_class FROM tenant_quotas WHERE tenant_id = $1 "
    "UNION SELECT runtime_class FROM quota_usage WHERE tenant_id = $1"
)
_COHORT_OF = "SELECT cohort FROM tenants WHERE id = $1"
# The tasks parked by a quota reason in the classes $3, of the tenant $1 and of the members
# of the cohorts $2 (tenants nobody configured are in the default cohort). Rows a pass holds
# are skipped: it is examining them now, under the quota this change leaves.
_QUOTA_PARKED_WAKE = (
    "WITH c AS (SELECT t.id FROM tasks t LEFT JOIN tenants n ON n.id = t.tenant_id "
    "WHERE t.state = 'ADMITTED' AND t.parked AND t.runtime_class = ANY($3::text[]) "
    "AND (t.pending_reason ->> 'code') IN ('quota_exceeded', 'quota_borrow_unavailable') "
    "AND (t.tenant_id = $1 OR coalesce(n.cohort, 'default') = ANY($2::text[])) "
    "ORDER BY t.id FOR UPDATE OF t SKIP LOCKED) "
    "UPDATE tasks t SET parked = false, updated_at = $4 FROM c WHERE t.id = c.id "
    "RETURNING t.id"
)
_QUOTAS_INSERT = (
    "INSERT INTO tenant_quotas (tenant_id, runtime_class, resource, nominal, borrowing_limit, "
    "lending_limit) SELECT $1, q.rc, q.resource, q.nominal, q.borrowing, q.lending "
    "FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[]) "
    "AS q(rc, resource, nominal, borrowing, lending)"
)


async def tenant_put(
    conn: Connection,
    *,
    tenant_id: str,
    cohort: str,
    fair_weight: float,
    quotas: Mapping[str, Mapping[str, Quota]],
    now: datetime,
) -> TenantRow:
    """Replace the tenant's settings (cohort, fair weight, every quota); return them.

    The quota usage rows of every runtime class the tenant had or now has a quota in, or
    uses under quota, are computed again from the live leases (a 409 when a new quota is
    below what the tenant uses now), and the tasks parked by a quota reason in those
    classes, of the tenant and of the cohorts it leaves and joins (whose members borrow
    from it), are woken; no other parked task is.

    The upsert locks the tenant's row first: a concurrent PUT of the same tenant waits for
    this one to commit, then reads the classes it left (the last write wins whole).
    """
    was = await conn.fetchval(_COHORT_OF, tenant_id)
    await conn.execute(_UPSERT, tenant_id, cohort, fair_weight, now)
    before = {r[0] for r in await conn.fetch(_CLASSES_OF, tenant_id)}
    await conn.execute(_QUOTAS_DELETE, tenant_id)
    items = sorted(
        (rc, res, q) for rc, by_res in quotas.items() for res, q in by_res.items()
    )
    if items:
        await conn.execute(
            _QUOTAS_INSERT, tenant_id, [i[0] for i in items], [i[1] for i in items],
            [i[2].nominal for i in items], [i[2].borrowing_limit for i in items],
            [i[2].lending_limit for i in items],
        )
    try:
        await quota_usage_rebuild(conn, runtime_classes=before | set(quotas))
    except asyncpg.CheckViolationError:
        raise QuotaBelowUsage(
            f"a quota of tenant {tenant_id} is below what it uses now (nominal + "
            "borrowingLimit must hold its live leases); nothing was changed"
        ) from None
    classes = sorted(before | set(quotas))
    cohorts = sorted({cohort, was or DEFAULT_COHORT})
    if classes and await conn.fetch(_QUOTA_PARKED_WAKE, tenant_id, cohorts, classes, now):
        # The tasks are unparked already: the wakeup names nothing, it only starts a pass.
        await wakeup_notify(conn, source=WakeSource.QUOTA_CHANGED, pools=())
    return (await tenants_read(conn, tenant_ids=[tenant_id]))[tenant_id]


# Per tenant with a quota: its nominal per resource (summed over runtime classes) times its
# fair weight.
_ENTITLEMENTS = (
    "SELECT q.tenant_id, q.resource, sum(q.nominal) * coalesce(min(n.fair_weight), 1) "
    "FROM tenant_quotas q LEFT JOIN tenants n ON n.id = q.tenant_id "
    "WHERE q.tenant_id = ANY($1::text[]) GROUP BY 1, 2"
)


async def tenants_entitlements(
    conn: Connection, *, tenant_ids: Collection[str]
) -> dict[str, tuple[float, float, float]]:
    """Return, per tenant of ``tenant_ids`` with a quota, nominal x fair weight per resource
    (cpuMillis, memoryMiB, llmSlots; 0 where its quotas leave the resource out)."""
    out: dict[str, list[float]] = {}
    for r in await conn.fetch(_ENTITLEMENTS, sorted(set(tenant_ids))):
        out.setdefault(r[0], [0.0, 0.0, 0.0])[QUOTA_RESOURCES.index(r[1])] = float(r[2])
    return {t: (v[0], v[1], v[2]) for t, v in out.items()}


# Usage by tenant in the runtime classes ``$1``: the reservations of live leases (not holds).
_USAGE = (
    "SELECT t.tenant_id, t.runtime_class, sum(r.cpu), sum(r.memory), sum(r.llm) "
    "FROM reservations r JOIN tasks t ON t.id = r.task_id "
    "WHERE NOT r.hold AND t.runtime_class = ANY($1::text[]) GROUP BY 1, 2"
)
# The runtime classes the tenants ``$1`` use now or have a quota in.
_CLASSES = (
    "SELECT DISTINCT t.runtime_class FROM reservations r JOIN tasks t ON t.id = r.task_id "
    "WHERE NOT r.hold AND t.tenant_id = ANY($1::text[]) "
    "UNION SELECT runtime_class FROM tenant_quotas WHERE tenant_id = ANY($1::text[])"
)
# The cohort members of ``$1`` (configured tenants of the same cohorts), with their cohort.
_COHORT_MEMBERS = (
    "SELECT m.id, m.cohort FROM tenants m WHERE m.cohort = ANY($1::text[])"
)


def _vector(raw: Mapping[str, int]) -> dict[str, int]:
    return {res: int(raw.get(res, 0)) for res in QUOTA_RESOURCES}


async def _used(
    conn: Connection, *, runtime_classes: Collection[str]
) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in await conn.fetch(_USAGE, sorted(set(runtime_classes))):
        out.setdefault(r[0], {})[r[1]] = dict(
            zip(QUOTA_RESOURCES, (int(r[2]), int(r[3]), int(r[4])), strict=True)
        )
    return out


def _borrowable(
    tenant: TenantRow,
    runtime_class: str,
    resource: str,
    *,
    members: Collection[TenantRow],
    used: Mapping[str, Mapping[str, Mapping[str, int]]],
) -> int | None:
    """Return what ``tenant`` could borrow now above its nominal (None: not limited)."""
    own = tenant.quotas.get(runtime_class, {}).get(resource)
    managed = any(resource in m.quotas.get(runtime_class, {}) for m in members)
    if not managed:
        return None
    lendable = 0
    borrowed = 0
    for m in members:
        q = m.quotas.get(runtime_class, {}).get(resource)
        u = used.get(m.id, {}).get(runtime_class, {}).get(resource, 0)
        nominal = q.nominal if q else 0
        borrowed += max(0, u - nominal)
        if m.id != tenant.id and q is not None:
            unused = max(0, nominal - u)
            lendable += unused if q.lending_limit is None else min(q.lending_limit, unused)
    left = max(0, lendable - borrowed)
    if own is not None and own.borrowing_limit is not None:
        u = used.get(tenant.id, {}).get(runtime_class, {}).get(resource, 0)
        left = min(left, max(0, own.borrowing_limit - max(0, u - own.nominal)))
    return left


async def tenants_usage(
    conn: Connection, *, tenants: Collection[TenantRow]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Return per tenant, per runtime class it uses or has a quota in: ``used``, ``borrowed``
    and ``borrowable`` per resource (``borrowable`` null where no one's quota names the
    resource, so nothing limits it)."""
    if not tenants:
        return {}
    cohorts = sorted({t.cohort for t in tenants})
    classes_of = [r[0] for r in await conn.fetch(_CLASSES, sorted(t.id for t in tenants))]
    used = await _used(conn, runtime_classes=classes_of)
    member_ids = {r[0]: r[1] for r in await conn.fetch(_COHORT_MEMBERS, cohorts)}
    for t in tenants:
        member_ids[t.id] = t.cohort
    # Tenants nobody configured are in the default cohort.
    unknown = set(used) - member_ids.keys()
    rows = await tenants_read(conn, tenant_ids=set(member_ids) | unknown)
    for tenant_id in unknown:
        member_ids[tenant_id] = rows[tenant_id].cohort
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for t in tenants:
        members = [rows[i] for i, c in member_ids.items() if c == t.cohort]
        classes = sorted(set(used.get(t.id, {})) | set(t.quotas))
        view: dict[str, dict[str, Any]] = {}
        for rc in classes:
            mine = _vector(used.get(t.id, {}).get(rc, {}))
            quota = t.quotas.get(rc, {})
            view[rc] = {
                "used": mine,
                "borrowed": {
                    res: max(0, mine[res] - (quota[res].nominal if res in quota else 0))
                    if _borrowable(t, rc, res, members=members, used=used) is not None else 0
                    for res in QUOTA_RESOURCES
                },
                "borrowable": {
                    res: _borrowable(t, rc, res, members=members, used=used)
                    for res in QUOTA_RESOURCES
                },
            }
        out[t.id] = view
    return out
