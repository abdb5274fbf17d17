"""Reclaim in the ledger: the reads a pass plans reclaims from, and who a revocation was for.

A reclaim is applied as a preemption is (:mod:`app.ledger.preemption`): its victims' leases
go ``REVOKING`` with ``preempted_by`` = the reclaiming task, which waits parked with the
pending code ``reclaiming`` and holds the capacity they free. What differs is read here:

* :func:`displacers_read`: the preemptors and reclaimers still waiting and what each needs:
  a pass counts it as their tenants' usage, so the room a displacement waits for is neither
  lent again nor reclaimed twice (:func:`~app.scheduling.reclaim.displacers_counted`);
* :func:`displacers_count`: quota rows with those needs counted (the pass and every
  preview read them so);
* :func:`reclaim_revoking_read`: per (tenant, runtime class), what leases being revoked
  will give back (so the usage of a displacement's victims is given back once, and a victim
  tenant's borrowed work is never taken twice);
* :func:`reclaim_victims_read`: the leased tasks of the borrowing tenants on the pools the
  reclaiming tasks could take, leased before the minimum runtime, none being revoked;
* :func:`reclaimed_of`: which of the victims whose leases ended were revoked by another
  tenant's task (a reclaim, not a same-tenant preemption): their event is ``reclaimed``.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from app.db import Connection
from app.scheduling.plugins.quota import QuotaRow
from app.scheduling.preemption import Victim
from app.scheduling.reclaim import displacers_counted
from app.scheduling.records import RECLAIMING, Vector

__all__ = ["RECLAIMED", "RECLAIMING", "displacers_count", "displacers_read",
           "reclaim_revoking_read", "reclaim_victims_read", "reclaimed_of"]

#: Pending code (and event reason) of a task waiting for the borrowed leases it reclaims.
#: Event reason of a reclaim's victim going back to the queue (released or revoked).
RECLAIMED = "reclaimed"

Key = tuple[str, str]

# Reservations of leases being revoked (few, and indexed), by tenant and class.
_REVOKING = (
    "SELECT t.tenant_id, t.runtime_class, sum(r.cpu), sum(r.memory), sum(r.llm) "
    "FROM reservations r JOIN tasks t ON t.id = r.task_id "
    "WHERE NOT r.hold AND t.runtime_class = ANY($1::text[]) AND r.task_id IN (SELECT "
    "l.task_id FROM leases l WHERE l.state = 'REVOKING' AND l.revoke_by IS NOT NULL) "
    "GROUP BY 1, 2"
)
# The preemptors and reclaimers still waiting (holding capacity; the holds are few and
# indexed), with what each needs in its runtime class.
_DISPLACERS = (
    "SELECT t.id, t.tenant_id, t.spec ->> 'runtimeClass', "
    "coalesce((t.spec -> 'requests' ->> 'cpuMillis')::bigint, 0) * m.n, "
    "coalesce((t.spec -> 'requests' ->> 'memoryMiB')::bigint, 0) * m.n, "
    "coalesce((t.spec -> 'requests' ->> 'llmSlots')::bigint, 0) * m.n "
    "FROM tasks t CROSS JOIN LATERAL (SELECT coalesce((t.spec -> 'gang' ->> 'members')::int, "
    "1) AS n) m WHERE t.id IN (SELECT r.task_id FROM reservations r WHERE r.hold) "
    "AND t.state = 'ADMITTED' "
    "AND t.pending_reason ->> 'code' IN ('preempting', 'reclaiming')"
)


async def displacers_read(conn: Connection) -> dict[uuid.UUID, tuple[str, str, Vector]]:
    """Return the preemptors and reclaimers still waiting: (tenant, runtime class, need) by
    task. Their needs count as their tenants' usage: the room they wait for is not lent
    again."""
    return {r[0]: (r[1], r[2], (int(r[3]), int(r[4]), int(r[5])))
            for r in await conn.fetch(_DISPLACERS)}


async def displacers_count(
    conn: Connection, rows: Sequence[QuotaRow], *, revoking_wanted: bool = False,
) -> tuple[list[QuotaRow], frozenset[uuid.UUID], dict[Key, Vector]]:
    """Return ``rows`` with the needs of the preemptors and reclaimers waiting in their
    classes counted, the waiting ones, and what the leases being revoked give back beyond
    those needs (:func:`~app.scheduling.reclaim.displacers_counted`). The leases being
    revoked are read only when some need is counted or ``revoking_wanted``."""
    classes = {r.runtime_class for r in rows}
    waits = await displacers_read(conn)
    needs = [w for w in waits.values() if w[1] in classes]
    if not (needs or revoking_wanted):
        return list(rows), frozenset(waits), {}
    counted, revoking = displacers_counted(
        list(rows), needs, await reclaim_revoking_read(conn, runtime_classes=classes))
    return counted, frozenset(waits), revoking


async def reclaim_revoking_read(
    conn: Connection, *, runtime_classes: Collection[str]
) -> dict[Key, Vector]:
    """Return, by (tenant, class), what the leases being revoked in ``runtime_classes``
    will give back."""
    return {(r[0], r[1]): (int(r[2]), int(r[3]), int(r[4]))
            for r in await conn.fetch(_REVOKING, sorted(set(runtime_classes)))}


# Leased tasks of the tenants holding reservations on the pools, leased at or before the
# cut-off, none of whose leases is being revoked already (every pool of a gang is listed).
_VICTIMS = (
    "SELECT t.id::text, t.tenant_id, t.priority, t.leased_at, t.spec -> 'requests', "
    "array_agg(r.pool_id ORDER BY r.pool_id), array_agg(r.members ORDER BY r.pool_id) "
    "FROM tasks t JOIN reservations r ON r.task_id = t.id AND NOT r.hold "
    "WHERE t.tenant_id = ANY($1::text[]) AND (t.state = 'LEASED') IS TRUE "
    "AND t.leased_at <= $3 AND EXISTS (SELECT 1 FROM reservations x WHERE x.task_id = t.id "
    "AND x.pool_id = ANY($2::text[])) "
    "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.task_id = t.id AND l.state = 'REVOKING') "
    "GROUP BY t.id"
)


def _vector(raw: Any) -> Vector:
    raw = raw or {}
    return (int(raw.get("cpuMillis", 0)), int(raw.get("memoryMiB", 0)),
            int(raw.get("llmSlots", 0)))


def victims_of(rows: Iterable[Any]) -> list[Victim]:
    """Return the victims of rows ``(id, tenant, priority, leased_at, requests JSON, pool ids,
    members per pool)``."""
    return [
        Victim(r[0], r[1], int(r[2]), r[3].timestamp() if r[3] else 0.0, _vector(r[4]),
               tuple(zip(r[5], (int(m) for m in r[6]), strict=True)))
        for r in rows
    ]


async def reclaim_victims_read(
    conn: Connection,
    *,
    tenant_ids: Collection[str],
    pool_ids: Collection[str],
    leased_before: datetime,
) -> list[Victim]:
    """Return the leased tasks of ``tenant_ids`` on ``pool_ids`` that a reclaim could take:
    leased at or before ``leased_before``, not being revoked."""
    if not tenant_ids or not pool_ids:
        return []
    rows = await conn.fetch(_VICTIMS, sorted(set(tenant_ids)), sorted(set(pool_ids)),
                            leased_before)
    return victims_of(rows)


_RECLAIMED = (
    "SELECT v.id FROM unnest($1::uuid[], $2::uuid[]) AS h(victim, heir) "
    "JOIN tasks v ON v.id = h.victim JOIN tasks x ON x.id = h.heir "
    "WHERE v.tenant_id <> x.tenant_id"
)


async def reclaimed_of(
    conn: Connection, *, heirs: Mapping[uuid.UUID, uuid.UUID]
) -> set[uuid.UUID]:
    """Return the victims among ``heirs`` (victim -> the task that revoked it) that another
    tenant's task revoked: reclaim victims."""
    if not heirs:
        return set()
    pairs = sorted(heirs.items())
    rows = await conn.fetch(_RECLAIMED, [v for v, _ in pairs], [h for _, h in pairs])
    return {r[0] for r in rows}
