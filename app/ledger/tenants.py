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
from app.ledger.quotas import quota_rows_read, quota_tree_read, quota_usage_rebuild
from app.ledger.wakeups import WakeSource, wakeup_notify
from app.scheduling.plugins.quota import QuotaBook

__all__ = [
    "DEFAULT_COHORT",
    "Quota",
    "QuotaBelowUsage",
    "TenantNotFound",
    "TenantRow",
    "TenantUsage",
    "quota_book_read",
    "quota_parked_wake",
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
# of the cohorts $2 (tenants nobody configured are in the default cohort), and the waiting
# preemptors and reclaimers of every cohort of those cohorts' trees: what one cohort lends,
# the others borrow through their common ancestors, so a change anywhere in the tree may
# refuse a displacement that holds capacity. Rows a pass holds are skipped: it is examining
# them now, under the quota this change leaves.
_QUOTA_PARKED_WAKE = (
    "WITH RECURSIVE up AS (SELECT x COLLATE \"C\" AS id FROM unnest($2::text[]) x "
    "UNION SELECT k.parent FROM up JOIN cohorts k ON k.id = up.id AND k.parent IS NOT NULL), "
    "tree AS (SELECT up.id FROM up LEFT JOIN cohorts k ON k.id = up.id "
    "WHERE k.parent IS NULL "
    "UNION SELECT k.id FROM tree JOIN cohorts k ON k.parent = tree.id), "
    "c AS (SELECT t.id FROM tasks t LEFT JOIN tenants n ON n.id = t.tenant_id "
    "WHERE t.state = 'ADMITTED' AND t.parked AND t.runtime_class = ANY($3::text[]) "
    "AND ((t.pending_reason ->> 'code') IN ('quota_exceeded', 'quota_borrow_unavailable') "
    "AND (t.tenant_id = $1 OR coalesce(n.cohort, 'default') = ANY($2::text[])) "
    "OR (t.pending_reason ->> 'code') IN ('preempting', 'reclaiming') "
    "AND (t.tenant_id = $1 OR coalesce(n.cohort, 'default') IN (SELECT id FROM tree))) "
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
    await quota_parked_wake(conn, tenant_id=tenant_id, cohorts={cohort, was or DEFAULT_COHORT},
                            runtime_classes=before | set(quotas), now=now)
    return (await tenants_read(conn, tenant_ids=[tenant_id]))[tenant_id]


async def quota_parked_wake(
    conn: Connection, *, tenant_id: str | None, cohorts: Collection[str],
    runtime_classes: Collection[str], now: datetime,
) -> None:
    """Unpark the tasks parked by a quota reason in ``runtime_classes`` of ``tenant_id``
    and of the members of ``cohorts``, and the preemptors and reclaimers waiting for their
    victims there or anywhere in the quota trees of ``cohorts`` (a pass gives back their
    holds when their quota refuses them now), and start a pass when there are any."""
    classes = sorted(set(runtime_classes))
    if classes and await conn.fetch(
        _QUOTA_PARKED_WAKE, tenant_id, sorted(set(cohorts)), classes, now
    ):
        # The tasks are unparked already: the wakeup names nothing, it only starts a pass.
        await wakeup_notify(conn, source=WakeSource.QUOTA_CHANGED, pools=())


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
    "WHERE NOT r.hold AND t.runtime_class = ANY($1::text[]) AND t.tenant_id = ANY($2::text[]) "
    "GROUP BY 1, 2"
)
# The runtime classes the tenants ``$1`` use now or have a quota in.
_CLASSES = (
    "SELECT DISTINCT t.runtime_class FROM reservations r JOIN tasks t ON t.id = r.task_id "
    "WHERE NOT r.hold AND t.tenant_id = ANY($1::text[]) "
    "UNION SELECT runtime_class FROM tenant_quotas WHERE tenant_id = ANY($1::text[])"
)


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """A tenant's usage by runtime class (``used``, ``borrowed``, ``borrowable`` per
    resource), its path in the quota tree and its share (largest over classes)."""

    usage: Mapping[str, Mapping[str, Any]]
    path: tuple[str, ...]
    share: float


async def quota_book_read(
    conn: Connection, *, runtime_classes: Collection[str], tenant_ids: Collection[str],
    cohorts: Mapping[str, str] = {},
) -> QuotaBook:
    """Return a quota book of ``runtime_classes`` as the ledger holds it now (``cohorts``:
    the tenants' cohorts when known already)."""
    rows, read = await quota_rows_read(
        conn, runtime_classes=runtime_classes, tenant_ids=tenant_ids)
    tree, weights, of = await quota_tree_read(
        conn, runtime_classes=runtime_classes, tenant_ids=tenant_ids)
    return QuotaBook(rows, {**of, **read, **cohorts}, tree, weights)


async def tenants_usage(
    conn: Connection, *, tenants: Collection[TenantRow]
) -> dict[str, TenantUsage]:
    """Return per tenant, per runtime class it uses or has a quota in: ``used``, ``borrowed``
    and ``borrowable`` per resource (``borrowable`` null where no quota names the
    resource, so nothing limits it), with its path and share."""
    if not tenants:
        return {}
    ids = sorted(t.id for t in tenants)
    classes_of = [r[0] for r in await conn.fetch(_CLASSES, ids)]
    used: dict[str, dict[str, tuple[int, int, int]]] = {}
    for r in await conn.fetch(_USAGE, sorted(set(classes_of)), ids):
        used.setdefault(r[0], {})[r[1]] = (int(r[2]), int(r[3]), int(r[4]))
    book = await quota_book_read(conn, runtime_classes=classes_of, tenant_ids=ids,
                                 cohorts={t.id: t.cohort for t in tenants})
    out: dict[str, TenantUsage] = {}
    for t in tenants:
        view: dict[str, dict[str, Any]] = {}
        share = 0.0
        for rc in sorted(set(used.get(t.id, {})) | set(t.quotas)):
            mine = used.get(t.id, {}).get(rc, (0, 0, 0))
            node = book.tenant_node(t.id, rc)
            borrowable = book.borrowable(t.id, rc)
            if node is not None:
                share = max(share, node.share)
            view[rc] = {
                "used": dict(zip(QUOTA_RESOURCES, mine, strict=True)),
                "borrowed": dict(zip(QUOTA_RESOURCES, node.borrowed if node else (0, 0, 0),
                                     strict=True)),
                "borrowable": dict(zip(QUOTA_RESOURCES, borrowable, strict=True)),
            }
        out[t.id] = TenantUsage(view, book.path(t.id), share)
    return out
