"""Cohorts: the inner nodes of the quota tree, as an admin set them, and their usage now.

A cohort has a parent (None: a root), a fair weight and quotas of its own per runtime class
and resource (capacity that belongs to it and is lent to its subtree). A cohort a tenant
names without a row is a root with no quota of its own. A tree is at most
:data:`MAX_DEPTH` cohorts deep and has no cycle; a cohort with members (tenants) or
children cannot be deleted.

Every change takes the quota lock exclusively (``app.ledger.quotas``) before it reads the
tree, so changes of the tree run one at a time: two that together would make a cycle cannot
both pass the check. The quota rows of every managed runtime class are then computed again
(the tree's shape moves every level's cap), and the quota-parked tasks of the cohort's
subtree in those classes are woken.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from app.db import Connection
from app.errors import Conflict, NotFound
from app.ledger.quotas import QUOTA_LOCK, quota_usage_rebuild
from app.ledger.tenants import DEFAULT_COHORT, Quota, quota_parked_wake

__all__ = [
    "MAX_DEPTH",
    "CohortCycle",
    "CohortInUse",
    "CohortNotFound",
    "CohortRowSettings",
    "CohortTooDeep",
    "cohort_delete",
    "cohort_put",
    "cohorts_list",
    "cohorts_parents",
    "cohorts_read",
    "cohorts_usage_read",
]

#: The most cohorts from a root down to a tenant's cohort.
MAX_DEPTH = 8


class CohortCycle(Conflict):
    """The parent is the cohort itself or below it: the tree would have a cycle."""

    type_slug = "cohort-cycle"


class CohortTooDeep(Conflict):
    """The tree would be deeper than the most cohorts from a root down allowed."""

    type_slug = "cohort-too-deep"


class CohortInUse(Conflict):
    """The cohort has members or children; move them first."""

    type_slug = "cohort-in-use"


class CohortNotFound(NotFound):
    """The cohort does not exist."""

    type_slug = "cohort-not-found"


@dataclass(frozen=True, slots=True)
class CohortRowSettings:
    """A cohort's settings: quotas by runtime class, then resource (API names);
    ``updated_at`` None for a cohort tenants name but nobody configured."""

    id: str
    parent: str | None = None
    fair_weight: float = 1.0
    quotas: Mapping[str, Mapping[str, Quota]] = field(default_factory=dict)
    updated_at: datetime | None = None


_LOCK = "SELECT pg_advisory_xact_lock($1)"
_PARENTS = "SELECT id, parent FROM cohorts"
_NAMED = (
    "SELECT DISTINCT cohort FROM tenants UNION SELECT parent FROM cohorts "
    "WHERE parent IS NOT NULL"
)
_COHORTS = (
    "SELECT id, parent, fair_weight, updated_at FROM cohorts WHERE id = ANY($1::text[])"
)
_QUOTAS = (
    "SELECT cohort_id, runtime_class, resource, nominal, borrowing_limit, lending_limit "
    "FROM cohort_quotas WHERE cohort_id = ANY($1::text[])"
)


async def cohorts_parents(conn: Connection) -> dict[str, str | None]:
    """Return the parent of every configured cohort."""
    return {r[0]: r[1] for r in await conn.fetch(_PARENTS)}


async def _known(conn: Connection) -> set[str]:
    """Return every cohort configured or named (by a tenant or as a parent)."""
    return ({r[0] for r in await conn.fetch(_PARENTS)}
            | {r[0] for r in await conn.fetch(_NAMED)} | {DEFAULT_COHORT})


async def cohorts_read(
    conn: Connection, *, cohort_ids: Collection[str]
) -> dict[str, CohortRowSettings]:
    """Return the settings of those of ``cohort_ids`` that exist (configured or named)."""
    ids = sorted(set(cohort_ids))
    known = await _known(conn)
    rows = {r[0]: r for r in await conn.fetch(_COHORTS, ids)}
    quotas: dict[str, dict[str, dict[str, Quota]]] = {}
    for r in await conn.fetch(_QUOTAS, ids):
        quotas.setdefault(r[0], {}).setdefault(r[1], {})[r[2]] = Quota(
            int(r[3]), None if r[4] is None else int(r[4]), None if r[5] is None else int(r[5])
        )
    out = {}
    for i in ids:
        row = rows.get(i)
        if row is not None:
            out[i] = CohortRowSettings(i, row[1], float(row[2]), quotas.get(i, {}), row[3])
        elif i in known:
            out[i] = CohortRowSettings(i)
    return out


async def cohorts_list(
    conn: Connection, *, after: str | None, limit: int
) -> list[CohortRowSettings]:
    """Return up to ``limit`` cohorts (configured or named) with ids after ``after``."""
    ids = sorted(i for i in await _known(conn) if after is None or i > after)[:limit]
    read = await cohorts_read(conn, cohort_ids=ids)
    return [read[i] for i in ids if i in read]


_USAGE = (
    "SELECT cohort, runtime_class, resource, cap, used FROM cohort_usage "
    "WHERE $1::text[] IS NULL OR cohort = ANY($1::text[]) ORDER BY 1, 2, 3"
)


async def cohorts_usage_read(
    conn: Connection, *, cohort_ids: Collection[str] | None
) -> list[tuple[str, str, str, int, int]]:
    """Return (cohort, class, resource, cap, used) of the rows of ``cohort_ids`` (None:
    of every cohort)."""
    ids = None if cohort_ids is None else sorted(set(cohort_ids))
    return [(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in await conn.fetch(_USAGE, ids)]


def _path(cohort: str | None, parents: Mapping[str, str | None]) -> list[str]:
    out: list[str] = []
    while cohort is not None and cohort not in out:
        out.append(cohort)
        cohort = parents.get(cohort)
    return out


def _height(cohort: str, parents: Mapping[str, str | None]) -> int:
    """Return how many cohorts deep the subtree of ``cohort`` is (1: no children)."""
    children: dict[str, list[str]] = {}
    for c, p in parents.items():
        if p is not None:
            children.setdefault(p, []).append(c)
    best, stack = 1, [(cohort, 1)]
    while stack:
        c, h = stack.pop()
        best = max(best, h)
        stack.extend((k, h + 1) for k in children.get(c, ()) if h < 64)
    return best


def _subtree(cohort: str, parents: Mapping[str, str | None]) -> set[str]:
    return {c for c in set(parents) | {cohort} if cohort in _path(c, parents)}


def tree_check(cohort_id: str, parent: str | None, parents: Mapping[str, str | None]) -> None:
    """Refuse (409) making ``parent`` the parent of ``cohort_id`` when that makes a cycle
    or a tree deeper than :data:`MAX_DEPTH`."""
    if parent is None:
        above: list[str] = []
    else:
        above = _path(parent, {**parents, cohort_id: None})
        if cohort_id in above:
            raise CohortCycle(
                f"cohort {parent} is {cohort_id} or below it: {cohort_id} cannot be its "
                "child")
    depth = len(above) + _height(cohort_id, parents)
    if depth > MAX_DEPTH:
        raise CohortTooDeep(
            f"the tree would be {depth} cohorts deep under {cohort_id}; at most {MAX_DEPTH}")


_UPSERT = (
    "INSERT INTO cohorts (id, parent, fair_weight, updated_at) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (id) DO UPDATE SET parent = EXCLUDED.parent, "
    "fair_weight = EXCLUDED.fair_weight, updated_at = EXCLUDED.updated_at"
)
_QUOTAS_DELETE = "DELETE FROM cohort_quotas WHERE cohort_id = $1"
_QUOTAS_INSERT = (
    "INSERT INTO cohort_quotas (cohort_id, runtime_class, resource, nominal, borrowing_limit, "
    "lending_limit) SELECT $1, q.rc, q.resource, q.nominal, q.borrowing, q.lending "
    "FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[]) "
    "AS q(rc, resource, nominal, borrowing, lending)"
)
_OWN_CLASSES = "SELECT DISTINCT runtime_class FROM cohort_quotas WHERE cohort_id = $1"
# Every runtime class with quota rows or quotas: the tree's shape moves every level's cap.
_CLASSES = (
    "SELECT runtime_class FROM cohort_usage UNION SELECT runtime_class FROM tenant_quotas "
    "UNION SELECT runtime_class FROM cohort_quotas"
)


async def cohort_put(
    conn: Connection, *, cohort_id: str, parent: str | None, fair_weight: float,
    quotas: Mapping[str, Mapping[str, Quota]], now: datetime,
) -> CohortRowSettings:
    """Replace the cohort's settings (parent, fair weight, every quota); return them.

    409 when the parent makes a cycle or a tree too deep. The quota rows are computed again
    and the quota-parked tasks of the cohort's subtree (before and after) are woken.
    """
    await conn.execute(_LOCK, QUOTA_LOCK)
    parents = await cohorts_parents(conn)
    tree_check(cohort_id, parent, parents)
    subtree = _subtree(cohort_id, parents)
    moved = cohort_id not in parents or parents[cohort_id] != parent
    before = {r[0] for r in await conn.fetch(_OWN_CLASSES, cohort_id)}
    await conn.execute(_UPSERT, cohort_id, parent, fair_weight, now)
    await conn.execute(_QUOTAS_DELETE, cohort_id)
    items = sorted((rc, res, q) for rc, by in quotas.items() for res, q in by.items())
    if items:
        await conn.execute(
            _QUOTAS_INSERT, cohort_id, [i[0] for i in items], [i[1] for i in items],
            [i[2].nominal for i in items], [i[2].borrowing_limit for i in items],
            [i[2].lending_limit for i in items],
        )
    # A cohort that moves in the tree moves every class's caps; otherwise only the classes
    # of its quotas before and after change.
    await _rebuilt(conn, cohorts=subtree, now=now,
                   classes=None if moved else before | set(quotas))
    return (await cohorts_read(conn, cohort_ids=[cohort_id]))[cohort_id]


async def _rebuilt(
    conn: Connection, *, cohorts: Collection[str], now: datetime,
    classes: Collection[str] | None = None,
) -> None:
    """Compute the quota rows of ``classes`` (None: every class with quota rows) again and
    wake the quota-parked tasks of the members of ``cohorts`` in them."""
    if classes is None:
        classes = {r[0] for r in await conn.fetch(_CLASSES)}
    await quota_usage_rebuild(conn, runtime_classes=classes)
    await quota_parked_wake(conn, tenant_id=None, cohorts=cohorts, runtime_classes=classes,
                            now=now)


_IN_USE = (
    "SELECT (SELECT count(*) FROM tenants WHERE cohort = $1), "
    "(SELECT count(*) FROM cohorts WHERE parent = $1)"
)
_DELETE = "DELETE FROM cohorts WHERE id = $1 RETURNING parent"


async def cohort_delete(conn: Connection, *, cohort_id: str, now: datetime) -> None:
    """Delete a configured cohort: 409 while it has members or children, 404 when it is
    not configured."""
    await conn.execute(_LOCK, QUOTA_LOCK)
    members, children = await conn.fetchrow(_IN_USE, cohort_id)
    if members or children:
        raise CohortInUse(
            f"cohort {cohort_id} has {members} member tenants and {children} child cohorts; "
            "move them to another cohort first")
    if await conn.fetchrow(_DELETE, cohort_id) is None:
        raise CohortNotFound(f"cohort {cohort_id} is not configured")
    await _rebuilt(conn, cohorts=[cohort_id], now=now)
