"""Pools and their ledger totals: every SQL statement the pool API needs.

A pool row holds identity, placement keys and operator intent (``status``); its ``ledgers``
row holds the capacity totals and what is reserved now; ``runtime_instances`` holds the last
heartbeat of the pool's runtime. :func:`pool_get` and :func:`pools_list` join the three into
one :class:`PoolRecord`.

Visibility (SPEC §2, §6) is one SQL predicate, :func:`pool_visible`: an admin sees every
pool, a tenant the pools listing one of its tenants, an operator the pools it operates or
that list one of its tenants, a runtime the pools of its own instances.

Concurrency: writes lock the pool (or ledger) row first and read after the lock, so a
capacity change never races a reservation and a delete never races a new lease; optimistic
edits compare ``version`` inside the UPDATE itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    cast,
    delete,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

from app.errors import Conflict, NotFound, PreconditionFailed
from app.ledger.tables import leases, ledgers, pools, reservations, runtime_instances
from app.ledger.wakeups import WakeSource, wakeup_notify

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

    @property
    def available(self) -> tuple[int, int, int] | None:
        """Return total minus reserved per dimension, or None without a ledger."""
        if self.capacity is None or self.reserved is None:
            return None
        return (
            self.capacity[0] - self.reserved[0],
            self.capacity[1] - self.reserved[1],
            self.capacity[2] - self.reserved[2],
        )

    def healthy(self, *, now: datetime, freshness_seconds: float) -> bool:
        """Return whether the pool is ready, heartbeat-fresh and has a registered ledger."""
        return (
            self.ready
            and self.capacity is not None
            and self.last_heartbeat_at is not None
            and now - self.last_heartbeat_at <= timedelta(seconds=freshness_seconds)
        )


def _text_array(values: Collection[str]) -> Any:
    return literal(sorted(values), ARRAY(Text))


def pool_visible(viewer: PoolViewer) -> ColumnElement[bool]:
    """Return the SQL predicate selecting the pools ``viewer`` may see."""
    if viewer.role == "admin":
        return true()
    tenants = pools.c.tenant_ids.overlap(_text_array(viewer.tenant_ids))
    if viewer.role == "tenant":
        return tenants if viewer.tenant_ids else false()
    if viewer.role == "operator":
        operates = pools.c.operators.contains(_text_array([viewer.subject]))
        return or_(operates, tenants) if viewer.tenant_ids else operates
    if viewer.role == "runtime" and viewer.runtime_instance_ids:
        return pools.c.runtime_instance_id.in_(sorted(viewer.runtime_instance_ids))
    return false()


def _live_leases() -> Any:
    return (
        select(func.count())
        .select_from(leases)
        .where(leases.c.pool_id == pools.c.id, leases.c.state == "ACTIVE")
        .scalar_subquery()
    )


def _pool_select() -> Any:
    return select(
        pools,
        ledgers.c.cpu_total,
        ledgers.c.memory_total,
        ledgers.c.llm_total,
        ledgers.c.cpu_reserved,
        ledgers.c.memory_reserved,
        ledgers.c.llm_reserved,
        runtime_instances.c.last_heartbeat_at,
        _live_leases().label("active_leases"),
    ).select_from(
        pools.outerjoin(ledgers, ledgers.c.pool_id == pools.c.id).outerjoin(
            runtime_instances, runtime_instances.c.id == pools.c.runtime_instance_id
        )
    )


def _record(row: Any) -> PoolRecord:
    has_ledger = row.cpu_total is not None
    return PoolRecord(
        id=row.id,
        tenant_ids=tuple(row.tenant_ids),
        runtime_class=row.runtime_class,
        runtime_instance_id=row.runtime_instance_id,
        region=row.region,
        data_residency=row.data_residency,
        failure_domain=row.failure_domain,
        labels=dict(row.labels),
        artifact_regions=tuple(row.artifact_regions),
        cost_weight=row.cost_weight,
        operators=tuple(row.operators),
        status=row.status,
        status_reason=row.status_reason,
        drain_deadline=row.drain_deadline,
        ready=row.ready,
        version=row.version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        capacity=(row.cpu_total, row.memory_total, row.llm_total) if has_ledger else None,
        reserved=(row.cpu_reserved, row.memory_reserved, row.llm_reserved) if has_ledger else None,
        last_heartbeat_at=row.last_heartbeat_at,
        active_leases=row.active_leases,
    )


async def pool_get(
    conn: AsyncConnection, *, pool_id: str, viewer: PoolViewer | None = None
) -> PoolRecord | None:
    """Return the pool ``pool_id`` if it exists and ``viewer`` (None: anyone) may see it."""
    query = _pool_select().where(pools.c.id == pool_id)
    if viewer is not None:
        query = query.where(pool_visible(viewer))
    row = (await conn.execute(query)).one_or_none()
    return None if row is None else _record(row)


async def pools_list(
    conn: AsyncConnection,
    *,
    viewer: PoolViewer,
    limit: int,
    after: str | None = None,
    status: str | None = None,
    runtime_class: str | None = None,
) -> tuple[list[PoolRecord], str | None]:
    """Return up to ``limit`` visible pools after id ``after`` in id order, and the last id
    when another page follows (else None)."""
    query = _pool_select().where(pool_visible(viewer))
    if after is not None:
        query = query.where(pools.c.id > after)
    if status is not None:
        query = query.where(pools.c.status == status)
    if runtime_class is not None:
        query = query.where(pools.c.runtime_class == runtime_class)
    rows = (await conn.execute(query.order_by(pools.c.id).limit(limit + 1))).all()
    records = [_record(r) for r in rows[:limit]]
    more = len(rows) > limit
    return records, (records[-1].id if more and records else None)


async def pool_create(
    conn: AsyncConnection, *, pool_id: str, fields: Mapping[str, Any], now: datetime
) -> PoolRecord:
    """Insert a new pool (status ACTIVE, no ledger yet) and wake reconcilers, or raise
    PoolExists."""
    values = {name: fields[name] for name in POOL_FIELDS if name in fields}
    inserted = await conn.scalar(
        pg_insert(pools)
        .values(id=pool_id, created_at=now, updated_at=now, **values)
        .on_conflict_do_nothing(index_elements=[pools.c.id])
        .returning(pools.c.id)
    )
    if inserted is None:
        raise PoolExists(f"a pool with id {pool_id!r} already exists")
    await wakeup_notify(conn, source=WakeSource.POOL_ADDED)
    return await _pool_require(conn, pool_id=pool_id)


async def _pool_require(conn: AsyncConnection, *, pool_id: str) -> PoolRecord:
    record = await pool_get(conn, pool_id=pool_id)
    if record is None:
        raise PoolNotFound()
    return record


async def _pool_lock(conn: AsyncConnection, *, pool_id: str) -> int:
    version = await conn.scalar(
        select(pools.c.version).where(pools.c.id == pool_id).with_for_update()
    )
    if version is None:
        raise PoolNotFound()
    return version


async def pool_update(
    conn: AsyncConnection,
    *,
    pool_id: str,
    changes: Mapping[str, Any],
    label_changes: Mapping[str, str | None] | None = None,
    expected_version: int | None,
    now: datetime,
) -> PoolRecord:
    """Apply ``changes`` and merge ``label_changes`` (None removes a label) into the pool,
    bump its version; raise PoolVersionMismatch when ``expected_version`` is not current."""
    values: dict[str, Any] = {name: changes[name] for name in POOL_FIELDS if name in changes}
    if label_changes:
        # Merged in SQL, not read-modify-write, so a concurrent edit's labels are never lost.
        label_set = {k: v for k, v in label_changes.items() if v is not None}
        label_unset = sorted(k for k, v in label_changes.items() if v is None)
        values["labels"] = pools.c.labels.op("||", return_type=JSONB)(
            cast(literal(label_set, JSONB), JSONB)
        ).op("-", return_type=JSONB)(cast(literal(label_unset, ARRAY(Text)), ARRAY(Text)))
    conditions = [pools.c.id == pool_id]
    if expected_version is not None:
        # Checked inside the UPDATE: a concurrent edit holding the row makes this one
        # re-check the new version after it commits, so exactly one of two wins.
        conditions.append(pools.c.version == expected_version)
    updated = await conn.scalar(
        update(pools)
        .where(*conditions)
        .values(version=pools.c.version + 1, updated_at=now, **values)
        .returning(pools.c.id)
    )
    if updated is None:
        if await conn.scalar(select(pools.c.id).where(pools.c.id == pool_id)) is None:
            raise PoolNotFound()
        raise PoolVersionMismatch()
    await wakeup_notify(conn, source=WakeSource.POOL_CHANGED)
    return await _pool_require(conn, pool_id=pool_id)


async def pool_delete(conn: AsyncConnection, *, pool_id: str) -> None:
    """Delete the pool, its ledger and its ended leases; raise PoolHasLiveLeases while a
    lease or reservation still holds capacity on it."""
    await _pool_lock(conn, pool_id=pool_id)
    # Read after the lock: a reconciler that leased onto this pool has committed by now
    # (its lease insert holds a key-share lock on the pool row), so its lease is counted.
    live = await conn.scalar(
        select(func.count())
        .select_from(leases)
        .where(leases.c.pool_id == pool_id, leases.c.state == "ACTIVE")
    )
    held = await conn.scalar(
        select(func.count()).select_from(reservations).where(reservations.c.pool_id == pool_id)
    )
    if live or held:
        raise PoolHasLiveLeases(
            f"pool {pool_id!r} still has {live} live lease(s) and {held} reservation(s); "
            "drain it and wait for them to end before deleting it"
        )
    await conn.execute(delete(leases).where(leases.c.pool_id == pool_id))
    await conn.execute(delete(pools).where(pools.c.id == pool_id))


async def pool_capacity_put(
    conn: AsyncConnection,
    *,
    pool_id: str,
    totals: tuple[int, int, int],
    now: datetime,
) -> PoolRecord:
    """Register or change the pool's ledger totals; raise CapacityBelowReserved when a total
    would fall below what is reserved now."""
    await _pool_lock(conn, pool_id=pool_id)
    current = (
        await conn.execute(
            select(
                ledgers.c.cpu_total,
                ledgers.c.memory_total,
                ledgers.c.llm_total,
                ledgers.c.cpu_reserved,
                ledgers.c.memory_reserved,
                ledgers.c.llm_reserved,
            )
            .where(ledgers.c.pool_id == pool_id)
            .with_for_update()
        )
    ).one_or_none()
    cpu, memory, llm = totals
    if current is None:
        await conn.execute(
            insert(ledgers).values(
                pool_id=pool_id, cpu_total=cpu, memory_total=memory, llm_total=llm, updated_at=now
            )
        )
        raised = True
    else:
        old_totals = (current.cpu_total, current.memory_total, current.llm_total)
        reserved = (current.cpu_reserved, current.memory_reserved, current.llm_reserved)
        for (_, name), total, held in zip(DIMENSIONS, totals, reserved, strict=True):
            if total < held:
                raise CapacityBelowReserved(
                    f"{name} total {total} is below the {held} reserved now",
                    extra={"dimension": name, "requested": total, "reserved": held},
                )
        await conn.execute(
            update(ledgers)
            .where(ledgers.c.pool_id == pool_id)
            .values(cpu_total=cpu, memory_total=memory, llm_total=llm, updated_at=now)
        )
        raised = any(new > old for new, old in zip(totals, old_totals, strict=True))
    await conn.execute(
        update(pools)
        .where(pools.c.id == pool_id)
        .values(version=pools.c.version + 1, updated_at=now)
    )
    if raised:
        await wakeup_notify(conn, source=WakeSource.LEDGER_RAISED)
    return await _pool_require(conn, pool_id=pool_id)


async def pool_status_set(
    conn: AsyncConnection,
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
    await conn.execute(
        update(pools)
        .where(pools.c.id == pool_id)
        .values(
            status=status,
            status_reason=reason,
            drain_deadline=drain_deadline if status == "DRAINING" else None,
            version=pools.c.version + 1,
            updated_at=now,
        )
    )
    if status == "ACTIVE":
        await wakeup_notify(conn, source=WakeSource.POOL_ACTIVATED)
    return await _pool_require(conn, pool_id=pool_id)


def pool_operable(record: PoolRecord, viewer: PoolViewer) -> bool:
    """Return whether ``viewer`` may cordon, drain or activate the pool."""
    return viewer.role == "admin" or (
        viewer.role == "operator" and viewer.subject in record.operators
    )


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
    "pool_capacity_put",
    "pool_create",
    "pool_delete",
    "pool_get",
    "pool_operable",
    "pool_status_set",
    "pool_update",
    "pool_visible",
    "pools_list",
]
