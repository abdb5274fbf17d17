"""Pools and their ledger totals: every SQL statement the pool API needs.

A pool row holds identity, placement keys and operator intent (``status``); its ``ledgers``
row holds the capacity totals and what is reserved now; ``runtime_instances`` holds the last
heartbeat of the pool's runtime. :func:`pool_get` and :func:`pools_list` join the three into
one :class:`PoolRecord`.

Visibility is one SQL predicate, ``_VISIBLE``, filled from a
:class:`PoolViewer`: an admin sees every pool, a tenant the pools listing one of its tenants,
an operator the pools it operates or that list one of its tenants, a runtime the pools of
its own instances.

What a pool shows of its use depends on the reader too (decided in
:mod:`app.services.pools`): the pool's totals to an admin, its operators and its runtime;
to a tenant only its own share (:func:`pools_tenant_usage`), next to the pool's free
capacity, so that tenants sharing a pool cannot watch each other's activity.

Concurrency: writes lock the pool (or ledger) row first and read after the lock, so a
capacity change never races a reservation and a delete never races a new lease; optimistic
edits compare ``version`` inside the UPDATE itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from app.db import Connection
from app.errors import Conflict, NotFound, PreconditionFailed
from app.ledger.wakeups import WakeSource, wakeup_notify

__all__ = [
    "DIMENSIONS",
    "POOL_FIELDS",
    "CapacityBelowReserved",
    "PoolExists",
    "PoolHasLiveLeases",
    "PoolNotFound",
    "PoolRecord",
    "PoolVersionMismatch",
    "PoolViewer",
    "TenantUsage",
    "pool_capacity_put",
    "pool_create",
    "pool_delete",
    "pool_get",
    "pool_status_set",
    "pool_update",
    "pools_list",
    "pools_visible_ids",
    "pools_tenant_usage",
]

#: Pool columns a caller may set at creation and change with PATCH.
POOL_FIELDS = (
    "tenant_ids",
    "runtime_class",
    "runtime_instance_id",
    "region",
    "data_residency",
    "failure_domain",
    "labels",
    "artifact_regions",
    "cost_weight",
    "operators",
    "ready",
)

#: Ledger dimensions: (column suffix, API name) in the order errors mention them.
DIMENSIONS = (("cpu", "cpuMillis"), ("memory", "memoryMiB"), ("llm", "llmSlots"))

_SELECT = """
    SELECT p.id, p.tenant_ids, p.runtime_class, p.runtime_instance_id, p.region,
           p.data_residency, p.failure_domain, p.labels, p.artifact_regions, p.cost_weight,
           p.operators, p.status, p.status_reason, p.drain_deadline, p.ready, p.version,
           p.created_at, p.updated_at,
           l.cpu_total, l.memory_total, l.llm_total,
           l.cpu_reserved, l.memory_reserved, l.llm_reserved,
           r.last_heartbeat_at,
           (SELECT count(*) FROM leases s
            WHERE s.pool_id = p.id AND s.state IN ('ACTIVE', 'REVOKING')) AS active_leases
    FROM pools p
    LEFT JOIN ledgers l ON l.pool_id = p.id
    LEFT JOIN runtime_instances r ON r.id = p.runtime_instance_id
"""

#: Who may see pool ``p``: $1 role, $2 subject, $3 tenant ids, $4 runtime instance ids.
#: An empty array overlaps nothing, so a key acting for no tenant sees no tenant's pools.
_VISIBLE = """(
    $1::text = 'admin'
    OR ($1 = 'tenant' AND p.tenant_ids && $3::text[])
    OR ($1 = 'operator' AND ($2::text = ANY (p.operators) OR p.tenant_ids && $3::text[]))
    OR ($1 = 'runtime' AND p.runtime_instance_id = ANY ($4::text[]))
)"""

_GET = _SELECT + "WHERE p.id = $1"
_GET_VISIBLE = _SELECT + "WHERE p.id = $5 AND " + _VISIBLE
_LIST = (
    _SELECT
    + "WHERE "
    + _VISIBLE
    + """
      AND ($5::text IS NULL OR p.id > $5)
      AND ($6::text IS NULL OR p.status = $6)
      AND ($7::text IS NULL OR p.runtime_class = $7)
    ORDER BY p.id LIMIT $8
"""
)

_VISIBLE_IDS = "SELECT p.id FROM pools p WHERE " + _VISIBLE

_LOCK = "SELECT version FROM pools WHERE id = $1 FOR UPDATE"
_EXISTS = "SELECT id FROM pools WHERE id = $1"
_LIVE_LEASES = (
    "SELECT count(*) FROM leases WHERE pool_id = $1 AND state IN ('ACTIVE', 'REVOKING')"
)
# The reservations on pool {pool}: those of its live leases (every live lease has its
# reservation on the same task and pool, and every reservation that is not a hold belongs
# to a live lease: the lease statement writes both, and ending or undoing a lease deletes
# or hands over both) and the preemptors' holds. Only holds are indexed by pool
# (revision 0010_pg); the live leases are, by ``ix_leases_pool_live``.
_OF_POOL = (
    "(SELECT v.task_id, v.cpu, v.memory, v.llm FROM leases s JOIN reservations v "
    "ON v.task_id = s.task_id AND v.pool_id = s.pool_id "
    "WHERE s.pool_id = {pool} AND s.state IN ('ACTIVE', 'REVOKING') "
    "UNION ALL SELECT v.task_id, v.cpu, v.memory, v.llm FROM reservations v "
    "WHERE v.pool_id = {pool} AND v.hold)"
)
_RESERVATIONS = f"SELECT count(*) FROM {_OF_POOL.format(pool='$1')} v"
_DELETE_LEASES = "DELETE FROM leases WHERE pool_id = $1"
_DELETE = "DELETE FROM pools WHERE id = $1"

_LEDGER_LOCK = """
    SELECT cpu_total, memory_total, llm_total, cpu_reserved, memory_reserved, llm_reserved
    FROM ledgers WHERE pool_id = $1 FOR UPDATE
"""
_LEDGER_ADD = """
    INSERT INTO ledgers (pool_id, cpu_total, memory_total, llm_total, updated_at)
    VALUES ($1, $2, $3, $4, $5)
"""
_LEDGER_SET = """
    UPDATE ledgers SET cpu_total = $2, memory_total = $3, llm_total = $4, updated_at = $5
    WHERE pool_id = $1
"""
_VERSION_BUMP = "UPDATE pools SET version = version + 1, updated_at = $2 WHERE id = $1"
_STATUS_SET = """
    UPDATE pools SET status = $2, status_reason = $3, drain_deadline = $4,
                     version = version + 1, updated_at = $5
    WHERE id = $1
"""


class PoolNotFound(NotFound):
    """The pool does not exist or is not visible to this caller."""


class PoolExists(Conflict):
    """A pool with this id already exists."""


class PoolHasLiveLeases(Conflict):
    """The pool still has live leases; drain it first."""


class PoolVersionMismatch(PreconditionFailed):
    """The pool changed since the ETag given in If-Match; read it again and retry."""


class CapacityBelowReserved(Conflict):
    """A capacity total would fall below what is reserved on the pool now."""


@dataclass(frozen=True, slots=True)
class PoolViewer:
    """Who reads pools: role, subject and what the key acts for."""

    role: str
    subject: str
    tenant_ids: frozenset[str] = frozenset()
    runtime_instance_ids: frozenset[str] = frozenset()

    def args(self) -> tuple[str, str, list[str], list[str]]:
        """Return the parameters $1..$4 of the visibility predicate."""
        return (
            self.role,
            self.subject,
            sorted(self.tenant_ids),
            sorted(self.runtime_instance_ids),
        )


@dataclass(frozen=True, slots=True)
class PoolRecord:
    """One pool with its ledger view, runtime heartbeat and live lease count."""

    id: str
    tenant_ids: tuple[str, ...]
    runtime_class: str
    runtime_instance_id: str
    region: str
    data_residency: str
    failure_domain: str
    labels: dict[str, str]
    artifact_regions: tuple[str, ...]
    cost_weight: float
    operators: tuple[str, ...]
    status: str
    status_reason: str | None
    drain_deadline: datetime | None
    ready: bool
    version: int
    created_at: datetime
    updated_at: datetime
    capacity: tuple[int, int, int] | None
    reserved: tuple[int, int, int] | None
    last_heartbeat_at: datetime | None
    active_leases: int
    #: Total minus reserved per dimension (None without a ledger): the pool's free capacity,
    #: whoever reads it.
    available: tuple[int, int, int] | None = None
    #: "pool" when ``reserved`` and ``active_leases`` are the pool's totals, "own" when they
    #: are only the reading tenants' (see :func:`pools_tenant_usage`).
    usage_scope: str = "pool"

    def usage_own(self, usage: TenantUsage) -> PoolRecord:
        """Return this pool with ``reserved`` and ``active_leases`` narrowed to ``usage``
        (the free capacity stays the pool's)."""
        reserved = usage.reserved if self.reserved is not None else None
        return replace(
            self, reserved=reserved, active_leases=usage.active_leases, usage_scope="own"
        )

    def healthy(self, *, now: datetime, freshness_seconds: float) -> bool:
        """Return whether the pool is ready, heartbeat-fresh and has a registered ledger."""
        return (
            self.ready
            and self.capacity is not None
            and self.last_heartbeat_at is not None
            and now - self.last_heartbeat_at <= timedelta(seconds=freshness_seconds)
        )


def _free(
    capacity: tuple[int, int, int] | None, reserved: tuple[int, int, int] | None
) -> tuple[int, int, int] | None:
    if capacity is None or reserved is None:
        return None
    return (capacity[0] - reserved[0], capacity[1] - reserved[1], capacity[2] - reserved[2])


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """What some tenants hold on one pool: reserved amounts and live leases."""

    reserved: tuple[int, int, int] = (0, 0, 0)
    active_leases: int = 0


def _record(row: Any) -> PoolRecord:
    has_ledger = row["cpu_total"] is not None
    capacity = (row["cpu_total"], row["memory_total"], row["llm_total"]) if has_ledger else None
    reserved = (
        (row["cpu_reserved"], row["memory_reserved"], row["llm_reserved"]) if has_ledger else None
    )
    return PoolRecord(
        id=row["id"],
        tenant_ids=tuple(row["tenant_ids"]),
        runtime_class=row["runtime_class"],
        runtime_instance_id=row["runtime_instance_id"],
        region=row["region"],
        data_residency=row["data_residency"],
        failure_domain=row["failure_domain"],
        labels=dict(row["labels"]),
        artifact_regions=tuple(row["artifact_regions"]),
        cost_weight=row["cost_weight"],
        operators=tuple(row["operators"]),
        status=row["status"],
        status_reason=row["status_reason"],
        drain_deadline=row["drain_deadline"],
        ready=row["ready"],
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        capacity=capacity,
        reserved=reserved,
        last_heartbeat_at=row["last_heartbeat_at"],
        active_leases=row["active_leases"],
        available=_free(capacity, reserved),
    )


async def pool_get(
    conn: Connection, *, pool_id: str, viewer: PoolViewer | None = None
) -> PoolRecord | None:
    """Return the pool ``pool_id`` if it exists and ``viewer`` (None: anyone) may see it."""
    if viewer is None:
        row = await conn.fetchrow(_GET, pool_id)
    else:
        row = await conn.fetchrow(_GET_VISIBLE, *viewer.args(), pool_id)
    return None if row is None else _record(row)


async def pools_visible_ids(conn: Connection, *, viewer: PoolViewer) -> list[str]:
    """Return the ids of every pool ``viewer`` may see."""
    return [r[0] for r in await conn.fetch(_VISIBLE_IDS, *viewer.args())]


async def pools_list(
    conn: Connection,
    *,
    viewer: PoolViewer,
    limit: int,
    after: str | None = None,
    status: str | None = None,
    runtime_class: str | None = None,
) -> tuple[list[PoolRecord], str | None]:
    """Return up to ``limit`` visible pools after id ``after`` in id order, and the last id
    when another page follows (else None)."""
    rows = await conn.fetch(_LIST, *viewer.args(), after, status, runtime_class, limit + 1)
    records = [_record(r) for r in rows[:limit]]
    more = len(rows) > limit
    return records, (records[-1].id if more and records else None)


_TENANT_USAGE = """
    SELECT p.pool_id,
           coalesce(r.cpu, 0), coalesce(r.memory, 0), coalesce(r.llm, 0), coalesce(l.n, 0)
    FROM unnest($1::text[]) AS p(pool_id)
    LEFT JOIN LATERAL (
        SELECT sum(v.cpu) AS cpu, sum(v.memory) AS memory, sum(v.llm) AS llm
        FROM """ + _OF_POOL.format(pool="p.pool_id") + """ v JOIN tasks t ON t.id = v.task_id
        WHERE t.tenant_id = ANY ($2::text[])
    ) r ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n
        FROM leases s JOIN tasks t ON t.id = s.task_id
        WHERE s.pool_id = p.pool_id AND s.state = 'ACTIVE' AND t.tenant_id = ANY ($2::text[])
    ) l ON true
"""


async def pools_tenant_usage(
    conn: Connection, *, pool_ids: Sequence[str], tenant_ids: Collection[str]
) -> dict[str, TenantUsage]:
    """Return what the tenants ``tenant_ids`` hold on each of ``pool_ids``: their
    reservations (leased and being placed) and their live leases, by pool."""
    if not pool_ids:
        return {}
    rows = await conn.fetch(_TENANT_USAGE, list(pool_ids), sorted(tenant_ids))
    return {
        r[0]: TenantUsage(reserved=(int(r[1]), int(r[2]), int(r[3])), active_leases=int(r[4]))
        for r in rows
    }


async def _pool_require(conn: Connection, *, pool_id: str) -> PoolRecord:
    record = await pool_get(conn, pool_id=pool_id)
    if record is None:
        raise PoolNotFound()
    return record


async def _pool_lock(conn: Connection, *, pool_id: str) -> int:
    version = await conn.fetchval(_LOCK, pool_id)
    if version is None:
        raise PoolNotFound()
    return version


async def pool_create(
    conn: Connection, *, pool_id: str, fields: Mapping[str, Any], now: datetime
) -> PoolRecord:
    """Insert a new pool (status ACTIVE, no ledger yet) and wake reconcilers, or raise
    PoolExists."""
    # Only the columns given are written, so the others take their schema defaults; the
    # names come from POOL_FIELDS, never from the caller.
    columns = [name for name in POOL_FIELDS if name in fields]
    placeholders = ", ".join(f"${i}" for i in range(3, len(columns) + 3))
    inserted = await conn.fetchval(
        f"INSERT INTO pools (id, created_at, updated_at{''.join(', ' + c for c in columns)}) "
        f"VALUES ($1, $2, $2{', ' + placeholders if columns else ''}) "
        "ON CONFLICT (id) DO NOTHING RETURNING id",
        pool_id,
        now,
        *(_column_value(c, fields[c]) for c in columns),
    )
    if inserted is None:
        raise PoolExists(f"a pool with id {pool_id!r} already exists")
    await wakeup_notify(conn, source=WakeSource.POOL_ADDED, pools=[pool_id])
    return await _pool_require(conn, pool_id=pool_id)


def _column_value(column: str, value: Any) -> Any:
    if column in ("tenant_ids", "artifact_regions", "operators"):
        return list(value)
    if column == "labels":
        return dict(value)
    return value


async def pool_update(
    conn: Connection,
    *,
    pool_id: str,
    changes: Mapping[str, Any],
    label_changes: Mapping[str, str | None] | None = None,
    expected_version: int | None,
    now: datetime,
) -> PoolRecord:
    """Apply ``changes`` and merge ``label_changes`` (None removes a label) into the pool,
    bump its version; raise PoolVersionMismatch when ``expected_version`` is not current."""
    args: list[Any] = [pool_id, expected_version, now]
    sets = ["version = version + 1", "updated_at = $3"]
    for name in POOL_FIELDS:
        if name in changes and not (name == "labels" and label_changes):
            args.append(_column_value(name, changes[name]))
            sets.append(f"{name} = ${len(args)}")
    if label_changes:
        # Merged in SQL, not read-modify-write, so a concurrent edit's labels are never lost.
        args.append({k: v for k, v in label_changes.items() if v is not None})
        args.append(sorted(k for k, v in label_changes.items() if v is None))
        sets.append(f"labels = (labels || ${len(args) - 1}::jsonb) - ${len(args)}::text[]")
    # The version is checked inside the UPDATE: a concurrent edit holding the row makes this
    # one re-check the new version after it commits, so exactly one of two wins.
    updated = await conn.fetchval(
        f"UPDATE pools SET {', '.join(sets)} "
        "WHERE id = $1 AND ($2::bigint IS NULL OR version = $2) RETURNING id",
        *args,
    )
    if updated is None:
        if await conn.fetchval(_EXISTS, pool_id) is None:
            raise PoolNotFound()
        raise PoolVersionMismatch()
    await wakeup_notify(conn, source=WakeSource.POOL_CHANGED, pools=[pool_id])
    return await _pool_require(conn, pool_id=pool_id)


async def pool_delete(conn: Connection, *, pool_id: str) -> None:
    """Delete the pool, its ledger and its ended leases; raise PoolHasLiveLeases while a
    lease or reservation still holds capacity on it."""
    await _pool_lock(conn, pool_id=pool_id)
    # Read after locking the ledger row: a pass that leased onto this pool reserved on that
    # row in the same transaction, so it has committed by now and its lease is counted; a
    # pass that comes later finds no ledger row and its reservation is refused.
    await conn.execute(_LEDGER_LOCK, pool_id)
    live = await conn.fetchval(_LIVE_LEASES, pool_id)
    held = await conn.fetchval(_RESERVATIONS, pool_id)
    if live or held:
        raise PoolHasLiveLeases(
            f"pool {pool_id!r} still has {live} live lease(s) and {held} reservation(s); "
            "drain it and wait for them to end before deleting it"
        )
    await conn.execute(_DELETE_LEASES, pool_id)
    await conn.execute(_DELETE, pool_id)


async def pool_capacity_put(
    conn: Connection,
    *,
    pool_id: str,
    totals: tuple[int, int, int],
    now: datetime,
) -> PoolRecord:
    """Register or change the pool's ledger totals; raise CapacityBelowReserved when a total
    would fall below what is reserved now."""
    await _pool_lock(conn, pool_id=pool_id)
    current = await conn.fetchrow(_LEDGER_LOCK, pool_id)
    cpu, memory, llm = totals
    if current is None:
        await conn.execute(_LEDGER_ADD, pool_id, cpu, memory, llm, now)
        raised = True
    else:
        old_totals = (current["cpu_total"], current["memory_total"], current["llm_total"])
        reserved = (
            current["cpu_reserved"],
            current["memory_reserved"],
            current["llm_reserved"],
        )
        for (_, name), total, held in zip(DIMENSIONS, totals, reserved, strict=True):
            if total < held:
                raise CapacityBelowReserved(
                    f"{name} total {total} is below the {held} reserved now",
                    extra={"dimension": name, "requested": total, "reserved": held},
                )
        await conn.execute(_LEDGER_SET, pool_id, cpu, memory, llm, now)
        raised = any(new > old for new, old in zip(totals, old_totals, strict=True))
    await conn.execute(_VERSION_BUMP, pool_id, now)
    if raised:
        await wakeup_notify(conn, source=WakeSource.LEDGER_RAISED, pools=[pool_id])
    return await _pool_require(conn, pool_id=pool_id)


async def pool_status_set(
    conn: Connection,
    *,
    pool_id: str,
    status: str,
    reason: str | None,
    drain_deadline: datetime | None,
    now: datetime,
) -> PoolRecord:
    """Set the pool's operator status (ACTIVE, CORDONED or DRAINING) with its reason and
    drain deadline; activating wakes reconcilers."""
    await _pool_lock(conn, pool_id=pool_id)
    deadline = drain_deadline if status == "DRAINING" else None
    await conn.execute(_STATUS_SET, pool_id, status, reason, deadline, now)
    if status == "ACTIVE":
        await wakeup_notify(conn, source=WakeSource.POOL_ACTIVATED, pools=[pool_id])
    return await _pool_require(conn, pool_id=pool_id)
