"""Quota usage in the ledger: each tenant's use of each managed runtime class and resource,
and each cohort's row of the quota tree, enforced by the database as pool capacity is.

A (runtime class, resource) is **managed** when some tenant's or cohort's quota names it.
For each one, ``quota_usage`` holds a row per tenant that has a quota there or uses it,
with the quota copied in, and ``cohort_usage`` a row per cohort of the tree with its cap
(its own nominal plus what its members lend it), what it lends its parent, its limit and
``used``: what its members draw on it, each ``max(0, used - kept)`` of its own row (kept:
what it does not lend). All of them move in the transaction that moves capacity:

* **Charge** (a pass, :func:`quota_charge`, after its leases, before its ledger statement):
  one conditional update raises the tenants' rows where ``used + amount <= cap`` (CHECKed
  too), rows locked in key order, and returns each one's draw on its cohort and the
  borrowed part of it. A placement whose draw is 0 touches only its tenant's rows. The
  others move the cohort rows up the tree with ``quota_tree_draw`` (revision
  0021_cohort_trees): every row on the paths locked first, deepest first; draws that
  borrow nothing one UPDATE per level; each (tenant, class) that borrows level by level,
  all of its resources or none, refused where a level would go past its limit. A refused
  pair leaves the tree as it was; the usage it added is given back, and its placements are
  undone by the caller. Every decrement anywhere is computed by the statement from the row
  it locks, never from a value read before.
* **Return** (every path that ends a lease: completion, release, cancel, expiry, revocation,
  drain, preemption hand-over): the statement that deletes the lease's reservations lowers
  the rows, every level, in the same statement (:data:`RETURN_CTES`).
* **Rebuild** (:func:`quota_usage_rebuild`, when an admin changes a tenant or a cohort):
  the rows of the affected classes are computed again from the quotas, the tree and the
  live leases, under an exclusive advisory lock that every pass takes shared at its start
  (``claims_settings``) and with the leased tasks of those classes locked, so no placement
  or lease end is missed.

Lock order as everywhere: task rows, lease rows, quota rows (key order), then the cohort
rows (deepest first, then key), then ledger rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.db import Connection
from app.ledger.reclaim import displacers_count
from app.scheduling.plugins.quota import CohortRow, QuotaRow

__all__ = [
    "QUOTA_LOCK",
    "RETURN_CTES",
    "QuotaPlan",
    "QuotaRead",
    "CohortRow",
    "QuotaRow",
    "cohort_rows_computed",
    "quota_charge",
    "quota_read",
    "quota_rows_read",
    "quota_tree_read",
    "quota_uncharge",
    "quota_usage_read",
    "quota_usage_rebuild",
]

#: The advisory lock key that orders quota rebuilds (exclusive) against passes (shared).
QUOTA_LOCK = 0x6265727468717461  # "berthqta"
RESOURCES = ("cpuMillis", "memoryMiB", "llmSlots")


@dataclass(frozen=True, slots=True)
class QuotaPlan:
    """What a pass charges: the tenant and runtime class of each placement in a managed
    class, the managed resources of those classes, and the quota rows that exist."""

    of: Mapping[uuid.UUID, tuple[str, str]] = field(default_factory=dict)
    managed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    rows: frozenset[tuple[str, str, str]] = frozenset()

    def amounts(
        self, grants: Iterable[tuple[uuid.UUID, tuple[int, int, int], int]]
    ) -> dict[tuple[str, str, str], int]:
        """Return the (tenant, class, resource) amounts of ``grants`` (task id, what one
        member requests, members) on managed resources."""
        # Summed per (tenant, class) first: a pass has one grant per placement.
        by: dict[tuple[str, str], list[int]] = {}
        of = self.of.get
        for task_id, (cpu, memory, llm), members in grants:
            who = of(task_id)
            if who is None:
                continue
            acc = by.setdefault(who, [0, 0, 0])
            acc[0] += cpu * members
            acc[1] += memory * members
            acc[2] += llm * members
        out: dict[tuple[str, str, str], int] = {}
        for (tenant_id, rc), acc in by.items():
            managed = self.managed[rc]
            for resource, amount in zip(RESOURCES, acc, strict=True):
                if amount > 0 and resource in managed:
                    out[(tenant_id, rc, resource)] = amount
        return out


_ROWS = (
    "SELECT tenant_id, runtime_class, resource, cohort, nominal, cap, lend, used "
    "FROM quota_usage WHERE runtime_class = ANY($1::text[])"
)
_COHORTS_OF = (
    "SELECT t, coalesce(n.cohort, 'default') FROM unnest($1::text[]) t "
    "LEFT JOIN tenants n ON n.id = t"
)


def _quota_row(r: Any) -> QuotaRow:
    return QuotaRow(r[0], r[1], r[2], r[3], int(r[4]), None if r[5] is None else int(r[5]),
                    None if r[6] is None else int(r[6]), int(r[7]))


async def quota_rows_read(
    conn: Connection, *, runtime_classes: Collection[str], tenant_ids: Collection[str]
) -> tuple[list[QuotaRow], dict[str, str]]:
    """Return the quota rows of ``runtime_classes`` (empty: none is managed) and, when some
    are, the cohort of each of ``tenant_ids``."""
    rows = [_quota_row(r) for r in await conn.fetch(_ROWS, sorted(set(runtime_classes)))]
    if not rows:
        return [], {}
    cohorts = {r[0]: r[1] for r in await conn.fetch(_COHORTS_OF, sorted(set(tenant_ids)))}
    return rows, cohorts


_COHORT_ROWS = (
    "SELECT c.cohort, c.runtime_class, c.resource, c.parent, c.nominal, c.cap, c.lend, "
    "c.lim, c.used, coalesce(n.fair_weight, 1) FROM cohort_usage c "
    "LEFT JOIN cohorts n ON n.id = c.cohort WHERE c.runtime_class = ANY($1::text[])"
)
_TENANTS_OF = (
    "SELECT t, coalesce(n.cohort, 'default'), coalesce(n.fair_weight, 1) "
    "FROM unnest($1::text[]) t LEFT JOIN tenants n ON n.id = t"
)


def _cohort_row(r: Any) -> CohortRow:
    return CohortRow(r[0], r[1], r[2], r[3], int(r[4]), int(r[5]), int(r[6]),
                     None if r[7] is None else int(r[7]), int(r[8]), float(r[9]))


async def quota_tree_read(
    conn: Connection, *, runtime_classes: Collection[str], tenant_ids: Collection[str]
) -> tuple[list[CohortRow], dict[str, float], dict[str, str]]:
    """Return the cohorts' rows of ``runtime_classes`` (the quota tree; empty: no class is
    managed) and, when there are some, the fair weight and the cohort of each of
    ``tenant_ids``."""
    rows = [_cohort_row(r) for r in await conn.fetch(_COHORT_ROWS, sorted(set(runtime_classes)))]
    if not rows:
        return [], {}, {}
    found = await conn.fetch(_TENANTS_OF, sorted(set(tenant_ids)))
    return rows, {r[0]: float(r[2]) for r in found}, {r[0]: r[1] for r in found}


@dataclass(frozen=True, slots=True)
class QuotaRead:
    """What a pass's planner checks quotas with: the quota rows and the quota tree of some
    runtime classes, and each tenant's cohort and fair weight (empty when no class is
    managed; the weights only when the classes have a tree)."""

    rows: tuple[QuotaRow, ...] = ()
    cohorts: Mapping[str, str] = field(default_factory=dict)
    tree: tuple[CohortRow, ...] = ()
    weights: Mapping[str, float] = field(default_factory=dict)


async def quota_read(
    conn: Connection, *, runtime_classes: Collection[str], tenant_ids: Collection[str]
) -> QuotaRead:
    """Return the quota rows of ``runtime_classes`` as a pass plans with them (the needs of
    the waiting preemptors and reclaimers counted, :func:`~app.ledger.reclaim.displacers_count`)
    and their quota tree, with the cohort and fair weight of each of ``tenant_ids`` read once
    for both."""
    classes = sorted(set(runtime_classes))
    rows = tuple(_quota_row(r) for r in await conn.fetch(_ROWS, classes))
    if rows:
        rows = tuple((await displacers_count(conn, rows))[0])
    tree = tuple(_cohort_row(r) for r in await conn.fetch(_COHORT_ROWS, classes))
    if not rows and not tree:
        return QuotaRead()
    found = await conn.fetch(_TENANTS_OF, sorted(set(tenant_ids)))
    return QuotaRead(rows, {r[0]: r[1] for r in found}, tree,
                     {r[0]: float(r[2]) for r in found} if tree else {})


_QUOTA_USAGE = (
    "SELECT q.tenant_id, q.runtime_class, q.resource, q.nominal, q.used "
    "FROM quota_usage q JOIN tenant_quotas t ON (t.tenant_id, t.runtime_class, t.resource) "
    "= (q.tenant_id, q.runtime_class, q.resource) ORDER BY 1, 2, 3"
)


async def quota_usage_read(conn: Connection) -> list[tuple[str, str, str, int, int]]:
    """Return (tenant, class, resource, nominal, used) of every tenant's quota."""
    return [(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in await conn.fetch(_QUOTA_USAGE)]


# --- charge -------------------------------------------------------------------------------

# Rows a tenant without a quota needs in a managed class: nominal 0, nothing to lend.
_ROWS_ENSURE = (
    "INSERT INTO quota_usage (tenant_id, runtime_class, resource, cohort, nominal, cap, lend) "
    "SELECT v.tenant_id, v.rc, v.resource, coalesce(n.cohort, 'default'), 0, NULL, 0 "
    "FROM unnest($1::text[], $2::text[], $3::text[]) AS v(tenant_id, rc, resource) "
    "LEFT JOIN tenants n ON n.id = v.tenant_id ON CONFLICT DO NOTHING"
)
# A cohort its tenants name without a row in the class (never configured, no quota): a
# root that holds nothing, so its members borrow nothing there.
_COHORTS_ENSURE = (
    "INSERT INTO cohort_usage (cohort, runtime_class, resource, lim) "
    "SELECT DISTINCT q.cohort, q.runtime_class, q.resource, 0 FROM quota_usage q "
    "JOIN unnest($1::text[], $2::text[], $3::text[]) AS v(tenant_id, rc, resource) "
    "ON (q.tenant_id, q.runtime_class, q.resource) = (v.tenant_id, v.rc, v.resource) "
    "ON CONFLICT DO NOTHING"
)
#: What a tenant's row keeps of its nominal (never lent): nominal - lending limit.
_KEPT = "(q.nominal - coalesce(q.lend, q.nominal))"
# Each row returns its draw on its cohort (``max(0, used - kept)`` after less before) and
# the borrowed part of it (what goes above nominal).
_CHARGE = (
    "WITH v AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) "
    "AS v(tenant_id, rc, resource, amount)), "
    "locked AS (SELECT q.tenant_id FROM quota_usage q JOIN v "
    "ON (q.tenant_id, q.runtime_class, q.resource) = (v.tenant_id, v.rc, v.resource) "
    "ORDER BY q.tenant_id, q.runtime_class, q.resource FOR UPDATE OF q) "
    "UPDATE quota_usage q SET used = q.used + v.amount FROM v "
    "WHERE (q.tenant_id, q.runtime_class, q.resource) = (v.tenant_id, v.rc, v.resource) "
    "AND (SELECT count(*) FROM locked) > 0 AND (q.cap IS NULL OR q.used + v.amount <= q.cap) "
    "RETURNING q.tenant_id, q.runtime_class, q.resource, q.cohort, "
    f"greatest(0, q.used - {_KEPT}) - greatest(0, q.used - v.amount - {_KEPT}), "
    "greatest(0, q.used - q.nominal) - greatest(0, q.used - v.amount - q.nominal)"
)
# The cohorts' rows up the paths of the draws, deepest first (quota_tree_draw, revision
# 0021_cohort_trees); the units refused.
_TREE_DRAW = (
    "SELECT u FROM quota_tree_draw($1::int[], $2::text[], $3::text[], $4::text[], "
    "$5::bigint[], $6::bigint[]) AS u"
)
_UNCHARGE = (
    "WITH v AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) "
    "AS v(tenant_id, rc, resource, amount)), "
    "locked AS (SELECT q.tenant_id FROM quota_usage q JOIN v "
    "ON (q.tenant_id, q.runtime_class, q.resource) = (v.tenant_id, v.rc, v.resource) "
    "ORDER BY q.tenant_id, q.runtime_class, q.resource FOR UPDATE OF q) "
    "UPDATE quota_usage q SET used = q.used - v.amount FROM v "
    "WHERE (q.tenant_id, q.runtime_class, q.resource) = (v.tenant_id, v.rc, v.resource) "
    "AND (SELECT count(*) FROM locked) >= 0 "
    "RETURNING q.cohort, q.runtime_class, q.resource, "
    f"greatest(0, q.used - {_KEPT}) - greatest(0, q.used + v.amount - {_KEPT})"
)

Key = tuple[str, str]  # (tenant, runtime class)


def _columns(
    amounts: Mapping[tuple[str, str, str], int],
) -> tuple[list[str], list[str], list[str], list[int]]:
    keys = sorted(k for k, a in amounts.items() if a > 0)
    return ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
            [amounts[k] for k in keys])


async def quota_charge(
    conn: Connection, *, amounts: Mapping[tuple[str, str, str], int], exists: Iterable[
        tuple[str, str, str]]
) -> set[Key]:
    """Add ``amounts`` ((tenant, class, resource) -> amount, managed resources only) to the
    tenants' usage and, where they borrow, to their cohorts' borrowed totals; return the
    (tenant, class) pairs refused (nothing of theirs stays added).

    ``exists`` names the rows already present (the pass read them); the others are created
    first, for tenants without a quota (nominal 0).
    """
    cols = _columns(amounts)
    if not cols[0]:
        return set()
    have = set(exists)
    missing = [k for k in zip(cols[0], cols[1], cols[2], strict=True) if k not in have]
    if missing:
        m = list(zip(*missing, strict=True))
        await conn.execute(_ROWS_ENSURE, list(m[0]), list(m[1]), list(m[2]))
    rows = await conn.fetch(_CHARGE, *cols)
    charged = {(r[0], r[1], r[2]) for r in rows}
    refused: set[Key] = {(t, rc) for t, rc, res in zip(cols[0], cols[1], cols[2], strict=True)
                         if (t, rc, res) not in charged}
    draws = [r for r in rows if int(r[4]) != 0 and (r[0], r[1]) not in refused]
    if draws:
        k = list(zip(*[(r[0], r[1], r[2]) for r in draws], strict=True))
        await conn.execute(_COHORTS_ENSURE, list(k[0]), list(k[1]), list(k[2]))
        refused |= await _tree_draw(conn, [((r[0], r[1]), r[3], r[1], r[2], int(r[4]),
                                            int(r[5])) for r in draws])
    if refused:
        # Give back the usage the refused pairs added; their cohort rows were put back.
        back = {k: a for k, a in amounts.items() if (k[0], k[1]) in refused
                and k in charged}
        if back:
            await conn.execute(_USED_LOWER, *_columns(back))
    return refused


async def _tree_draw(
    conn: Connection, draws: list[tuple[Key, str, str, str, int, int]]
) -> set[Key]:
    """Move the cohort rows by ``draws`` ((tenant, class) unit, cohort, class, resource,
    draw, borrowed part), each unit all or nothing; return the units refused."""
    units = sorted({d[0] for d in draws})
    number = {u: i for i, u in enumerate(units)}
    draws = sorted(draws, key=lambda d: number[d[0]])  # a unit's entries together
    refused = await conn.fetch(
        _TREE_DRAW, [number[d[0]] for d in draws], [d[1] for d in draws],
        [d[2] for d in draws], [d[3] for d in draws], [d[4] for d in draws],
        [d[5] for d in draws],
    )
    return {units[r[0]] for r in refused}


# Undo a refused pair's charge (rows this transaction raised and holds locked).
_USED_LOWER = (
    "UPDATE quota_usage q SET used = q.used - v.amount FROM unnest($1::text[], $2::text[], "
    "$3::text[], $4::bigint[]) AS v(tenant_id, rc, resource, amount) "
    "WHERE (q.tenant_id, q.runtime_class, q.resource) = (v.tenant_id, v.rc, v.resource)"
)


async def quota_uncharge(
    conn: Connection, *, amounts: Mapping[tuple[str, str, str], int]
) -> None:
    """Take ``amounts`` back off the tenants' usage (placements this transaction charged and
    then dropped), lowering their cohorts' rows up the tree by what they drew."""
    cols = _columns(amounts)
    if not cols[0]:
        return
    rows = [r for r in await conn.fetch(_UNCHARGE, *cols) if int(r[3]) != 0]
    if rows:
        await _tree_draw(conn, [(("", ""), r[0], r[1], r[2], int(r[3]), 0) for r in rows])


# --- return, inside the statements that delete reservations --------------------------------

#: CTEs to append to a statement whose CTE ``gone(task_id, pool_id, cpu, memory, llm)`` holds
#: the reservations of ended leases: they lower their tenants' usage rows (locked in key
#: order) and their cohorts' rows up the tree (``quota_tree_draw``, deepest first) in the same
#: statement. Rows of unmanaged classes do not exist, so nothing is updated for them. The
#: statement's main query must read ``gone_cohort`` (``(SELECT n FROM gone_cohort) >= 0``),
#: so that it runs.
RETURN_CTES = (
    "gone_q AS (SELECT t.tenant_id, t.runtime_class, x.resource, sum(x.amount) AS amount "
    "FROM gone g JOIN tasks t ON t.id = g.task_id "
    "CROSS JOIN LATERAL (VALUES ('cpuMillis', g.cpu), ('memoryMiB', g.memory), "
    "('llmSlots', g.llm)) AS x(resource, amount) WHERE x.amount > 0 GROUP BY 1, 2, 3), "
    "gone_locked AS (SELECT q.tenant_id FROM quota_usage q JOIN gone_q a "
    "ON (q.tenant_id, q.runtime_class, q.resource) = (a.tenant_id, a.runtime_class, a.resource) "
    "ORDER BY q.tenant_id, q.runtime_class, q.resource FOR UPDATE OF q), "
    "gone_used AS (UPDATE quota_usage q SET used = q.used - a.amount FROM gone_q a "
    "WHERE (q.tenant_id, q.runtime_class, q.resource) = (a.tenant_id, a.runtime_class, "
    "a.resource) AND (SELECT count(*) FROM gone_locked) >= 0 "
    "RETURNING q.cohort, q.runtime_class, q.resource, "
    f"greatest(0, q.used - {_KEPT}) - greatest(0, q.used + a.amount - {_KEPT}) AS drawn), "
    "gone_draw AS (SELECT cohort, runtime_class, resource, sum(drawn)::bigint AS drawn "
    "FROM gone_used GROUP BY 1, 2, 3 HAVING sum(drawn) <> 0), "
    "gone_cohort AS (SELECT count(*) AS n FROM (SELECT array_agg(0) AS u, "
    "array_agg(cohort) AS c, array_agg(runtime_class) AS rc, array_agg(resource) AS res, "
    "array_agg(drawn) AS d, array_agg(0::bigint) AS m FROM gone_draw) s, "
    "LATERAL quota_tree_draw(s.u, s.c, s.rc, s.res, s.d, s.m)) "
)


# --- rebuild --------------------------------------------------------------------------------

_REBUILD_LOCK = "SELECT pg_advisory_xact_lock($1)"
# The tasks holding live reservations in the classes: a lease end locks its task first, so
# holding these makes every lease end wait for the rebuild (and the rebuild for them).
_LEASED_LOCK = (
    "SELECT t.id FROM tasks t WHERE t.runtime_class = ANY($1::text[]) AND t.id IN (SELECT "
    "r.task_id FROM reservations r WHERE NOT r.hold) ORDER BY t.id FOR SHARE OF t"
)
_USAGE_DELETE = "DELETE FROM quota_usage WHERE runtime_class = ANY($1::text[])"
_COHORT_DELETE = "DELETE FROM cohort_usage WHERE runtime_class = ANY($1::text[])"
# Fair sharing's decayed usage of what no quota row manages any more: left, it would come
# back stale if the quota did.
_FAIR_PRUNE = (
    "DELETE FROM fair_usage f WHERE f.runtime_class = ANY($1::text[]) AND NOT EXISTS "
    "(SELECT 1 FROM quota_usage q WHERE (q.tenant_id, q.runtime_class, q.resource) "
    "= (f.tenant_id, f.runtime_class, f.resource))"
)
_USAGE_INSERT = (
    "WITH managed AS (SELECT runtime_class, resource FROM tenant_quotas "
    "WHERE runtime_class = ANY($1::text[]) UNION SELECT runtime_class, resource "
    "FROM cohort_quotas WHERE runtime_class = ANY($1::text[])), "
    "used AS (SELECT t.tenant_id, t.runtime_class, x.resource, sum(x.amount) AS amount "
    "FROM reservations r JOIN tasks t ON t.id = r.task_id "
    "CROSS JOIN LATERAL (VALUES ('cpuMillis', r.cpu), ('memoryMiB', r.memory), "
    "('llmSlots', r.llm)) AS x(resource, amount) "
    "WHERE NOT r.hold AND t.runtime_class = ANY($1::text[]) GROUP BY 1, 2, 3), "
    "who AS (SELECT tenant_id, runtime_class, resource FROM tenant_quotas "
    "WHERE runtime_class = ANY($1::text[]) UNION SELECT u.tenant_id, u.runtime_class, "
    "u.resource FROM used u JOIN managed m USING (runtime_class, resource) WHERE u.amount > 0) "
    "INSERT INTO quota_usage (tenant_id, runtime_class, resource, cohort, nominal, cap, lend, "
    "used) SELECT w.tenant_id, w.runtime_class, w.resource, coalesce(n.cohort, 'default'), "
    "coalesce(q.nominal, 0), q.nominal + q.borrowing_limit, "
    "CASE WHEN q.tenant_id IS NULL THEN 0 ELSE q.lending_limit END, coalesce(u.amount, 0) "
    "FROM who w LEFT JOIN tenant_quotas q ON (q.tenant_id, q.runtime_class, q.resource) = "
    "(w.tenant_id, w.runtime_class, w.resource) LEFT JOIN tenants n ON n.id = w.tenant_id "
    "LEFT JOIN used u ON (u.tenant_id, u.runtime_class, u.resource) = "
    "(w.tenant_id, w.runtime_class, w.resource)"
)
_TENANT_ROWS = (
    "SELECT cohort, runtime_class, resource, nominal, lend, used FROM quota_usage "
    "WHERE runtime_class = ANY($1::text[])"
)
_MANAGED = (
    "SELECT runtime_class, resource FROM tenant_quotas WHERE runtime_class = ANY($1::text[]) "
    "UNION SELECT runtime_class, resource FROM cohort_quotas "
    "WHERE runtime_class = ANY($1::text[])"
)
_TREE = "SELECT id, parent, fair_weight FROM cohorts"
_COHORT_QUOTAS = (
    "SELECT cohort_id, runtime_class, resource, nominal, borrowing_limit, lending_limit "
    "FROM cohort_quotas WHERE runtime_class = ANY($1::text[])"
)
_COHORT_INSERT = (
    "INSERT INTO cohort_usage (cohort, runtime_class, resource, parent, depth, nominal, cap, "
    "lend, lim, used) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], "
    "$5::int[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[])"
)

#: (cohort, class, resource) -> (nominal, borrowing limit, lending limit)
CohortQuotas = Mapping[tuple[str, str, str], tuple[int, int | None, int | None]]


def cohort_rows_computed(
    tenant_rows: Iterable[tuple[str, str, str, int, int | None, int]],
    parents: Mapping[str, str | None],
    quotas: CohortQuotas,
    managed: Iterable[tuple[str, str]],
) -> list[tuple[str, str, str, str | None, int, int, int, int, int | None, int]]:
    """Return the cohort rows of the tree from the tenants' rows ((cohort, class, resource,
    nominal, lending limit, used)): per managed (class, resource), every cohort configured
    or named, with (cohort, class, resource, parent, depth, nominal, cap, lend, lim, used),
    children before parents (a cohort's cap and usage are its members' sums)."""
    cohorts = (set(parents) | {p for p in parents.values() if p is not None}
               | {r[0] for r in tenant_rows})
    depth = {c: len(_path(c, parents)) - 1 for c in cohorts}
    order = sorted(cohorts, key=lambda c: (-depth[c], c))
    out = []
    for rc, resource in sorted(set(managed)):
        cap: dict[str, int] = {}
        used: dict[str, int] = {}
        for c_, rc_, res_, nominal, lend, u in tenant_rows:
            if (rc_, res_) == (rc, resource):
                lent = nominal if lend is None else min(lend, nominal)
                cap[c_] = cap.get(c_, 0) + lent
                used[c_] = used.get(c_, 0) + max(0, u - (nominal - lent))
        for c in order:
            nominal, borrowing, lending = quotas.get((c, rc, resource), (0, None, None))
            own = cap.get(c, 0) + nominal
            parent = parents.get(c)
            lent = own if lending is None else min(lending, own)
            lim = own if parent is None else (None if borrowing is None else own + borrowing)
            u = used.get(c, 0)
            out.append((c, rc, resource, parent, depth[c], nominal, own, lent, lim, u))
            if parent is not None:
                cap[parent] = cap.get(parent, 0) + lent
                used[parent] = used.get(parent, 0) + max(0, u - (own - lent))
    return out


def _path(cohort: str, parents: Mapping[str, str | None]) -> list[str]:
    out = [cohort]
    while (up := parents.get(out[-1])) is not None and up not in out:
        out.append(up)
    return out


async def quota_usage_rebuild(conn: Connection, *, runtime_classes: Collection[str]) -> None:
    """Compute the quota rows of ``runtime_classes`` again from the quotas, the tree and the
    live leases (after an admin changed a tenant or a cohort), waiting for passes and lease
    ends in flight."""
    classes = sorted(set(runtime_classes))
    if not classes:
        return
    await conn.execute(_REBUILD_LOCK, QUOTA_LOCK)
    await conn.execute(_LEASED_LOCK, classes)
    await conn.execute(_USAGE_DELETE, classes)
    await conn.execute(_COHORT_DELETE, classes)
    await conn.execute(_USAGE_INSERT, classes)
    await conn.execute(_FAIR_PRUNE, classes)
    tenant_rows = [(r[0], r[1], r[2], int(r[3]), None if r[4] is None else int(r[4]),
                    int(r[5])) for r in await conn.fetch(_TENANT_ROWS, classes)]
    parents = {r[0]: r[1] for r in await conn.fetch(_TREE)}
    quotas = {(r[0], r[1], r[2]): (int(r[3]), None if r[4] is None else int(r[4]),
                                   None if r[5] is None else int(r[5]))
              for r in await conn.fetch(_COHORT_QUOTAS, classes)}
    managed = [(r[0], r[1]) for r in await conn.fetch(_MANAGED, classes)]
    rows = cohort_rows_computed(tenant_rows, parents, quotas, managed)
    if rows:
        await conn.execute(_COHORT_INSERT, *[list(col) for col in zip(*rows, strict=True)])
