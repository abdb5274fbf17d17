"""Preemption in the ledger: revoking victims, holding their capacity for the preemptor.

The core plans a preemption purely (:mod:`app.scheduling.preemption`); this module is the SQL
that applies it and follows it through, with the database as the judge:

* **Apply** (inside :func:`app.ledger.plans.plan_apply`, one transaction):
  :func:`preemptions_apply` turns the victims' ``ACTIVE`` leases into ``REVOKING`` leases
  (``revoke_by``, ``preempted_by``) with a conditional update — a victim that completed, was
  cancelled or was taken by another preemptor meanwhile makes the preemption lose, and the
  whole plan rolls back. The preemptor goes back to ``ADMITTED``, parked with the pending
  code ``preempting``, and gets one *hold* row in ``reservations`` per pool of its members:
  the free part of its need there, reserved in the ledger like any reservation.
* **Hand over** (:func:`reservations_hand_over`, wherever a lease ends: completion, cancel,
  deadline, expiry, drain): a victim's reservation on a pool where its preemptor holds a row
  moves into that row instead of returning to the ledger, so no other task can take it (the
  capacity is *nominated*). The ledger's reserved amounts do not change, so they still equal
  the sum of the reservation rows. The rest is released as usual. When the preemptor's last
  victim has ended, it is unparked.
* **Deadline** (:func:`victims_revoke_overdue`, the leader's recovery round): a ``REVOKING``
  lease past ``revoke_by`` is ``REVOKED``; its task goes back to ``ADMITTED`` without using
  an attempt (``preemptions + 1`` keeps the next epoch higher, so a late completion with the
  old epoch is refused) with a ``preempted`` event naming the preemptor.
* **Placement**: a preemptor's pass reads its holds (:func:`holds_read`; free for it only) and
  takes them back at commit (:func:`holds_take`) before it reserves its placement, netting
  the two in the one ledger statement.

Lock order as everywhere: task rows, then lease rows, then the ledger (sorted, last). The
hand-over locks the preemptor's task row after the victim's (``FOR NO KEY UPDATE``): two
victims of one preemptor ending at once serialize on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from app.db import Connection
from app.ledger.events import task_events_add
from app.ledger.nominations import nominations_capture, nominees_lock
from app.ledger.quotas import RETURN_CTES
from app.ledger.reclaim import RECLAIMED, reclaimed_of, victims_of
from app.ledger.reservations import Vector, amounts_sum, reservations_release
from app.ledger.wakeups import WakeSource, wakeup_notify
from app.scheduling.preemption import Victim
from app.scheduling.records import PREEMPTING, Displaced

__all__ = [
    "PREEMPTING",
    "holds_read",
    "holds_take",
    "leases_end",
    "preemptors_unpark",
    "preemptors_waiting",
    "preemptions_apply",
    "reservations_hand_over",
    "victims_read",
    "victims_revoke_overdue",
]

#: Event reason of a victim whose lease went REVOKING (LEASED -> LEASED).
REVOKING = "revoking"
#: Event reason (and lease end reason) of a victim revoked at its deadline.
PREEMPTED = "preempted"


# --- reads of a pass ---------------------------------------------------------------------

# Leased tasks of the tenants, below the tenant's highest preemptor priority, whose leases
# are all ACTIVE (a task already being revoked is nobody's victim twice).
_VICTIMS = (
    "WITH b AS (SELECT * FROM unnest($1::text[], $2::int[]) AS b(tenant_id, below)) "
    "SELECT t.id::text, t.tenant_id, t.priority, t.leased_at, t.spec -> 'requests', "
    "array_agg(r.pool_id ORDER BY r.pool_id), array_agg(r.members ORDER BY r.pool_id) "
    "FROM b JOIN tasks t ON t.tenant_id = b.tenant_id AND t.state = 'LEASED' "
    "AND t.priority < b.below "
    "JOIN reservations r ON r.task_id = t.id "
    "WHERE NOT EXISTS (SELECT 1 FROM leases l WHERE l.task_id = t.id AND l.state = 'REVOKING') "
    "GROUP BY t.id"
)


async def victims_read(conn: Connection, *, below: Mapping[str, int]) -> list[Victim]:
    """Return the leased tasks that preemptors could displace: per tenant, those with a
    priority below ``below[tenant]`` and no revoking lease."""
    if not below:
        return []
    tenants = sorted(below)
    rows = await conn.fetch(_VICTIMS, tenants, [below[t] for t in tenants])
    return victims_of(rows)


_HOLDS = (
    "SELECT task_id, pool_id, cpu, memory, llm FROM reservations "
    "WHERE task_id = ANY($1::uuid[])"
)


async def holds_read(
    conn: Connection, *, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, dict[str, Vector]]:
    """Return the capacity each of ``task_ids`` (admitted or claimed) holds, by pool."""
    if not task_ids:
        return {}
    out: dict[uuid.UUID, dict[str, Vector]] = {}
    for r in await conn.fetch(_HOLDS, list(task_ids)):
        out.setdefault(r[0], {})[r[1]] = (int(r[2]), int(r[3]), int(r[4]))
    return out


_WAITING = (
    "SELECT preempted_by, count(DISTINCT task_id), min(revoke_by) FROM leases "
    "WHERE preempted_by = ANY($1::uuid[]) AND state = 'REVOKING' GROUP BY preempted_by"
)


async def preemptors_waiting(
    conn: Connection, *, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, tuple[int, datetime]]:
    """Return, for those of ``task_ids`` still waiting for victims, (victims, deadline)."""
    if not task_ids:
        return {}
    rows = await conn.fetch(_WAITING, list(task_ids))
    return {r[0]: (int(r[1]), r[2]) for r in rows}


# --- applying a plan ---------------------------------------------------------------------

_HOLDS_DELETE = (
    "DELETE FROM reservations WHERE task_id = ANY($1::uuid[]) "
    "RETURNING pool_id, cpu, memory, llm"
)


async def holds_take(conn: Connection, *, task_ids: Collection[uuid.UUID]) -> dict[str, Vector]:
    """Delete the holds of ``task_ids`` (admitted tasks the caller's pass holds locked) and
    return the amounts by pool; the caller subtracts them in its one ledger statement."""
    if not task_ids:
        return {}
    rows = await conn.fetch(_HOLDS_DELETE, sorted(task_ids))
    return amounts_sum((r[0], r[1], r[2], r[3]) for r in rows)


_REVOKE = (
    "UPDATE leases SET state = 'REVOKING', revoke_by = $2, preempted_by = $3 "
    "WHERE task_id = ANY($1::uuid[]) AND state = 'ACTIVE' RETURNING task_id"
)
_HOLDS_INSERT = (
    "INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm, created_at, hold) "
    "SELECT $1, h.pool_id, h.members, h.cpu, h.memory, h.llm, $2, true "
    "FROM unnest($3::text[], $4::int[], $5::bigint[], $6::bigint[], $7::bigint[]) "
    "AS h(pool_id, members, cpu, memory, llm)"
)


async def preemptions_apply(
    conn: Connection, *, preemptions: Iterable[Displaced], now: datetime
) -> set[uuid.UUID]:
    """Revoke each preemption's victims and insert its holds; return the preemptors whose
    victims were not all still ``ACTIVE`` (the caller rolls the plan back).

    The preemptors must already be handed back (``ADMITTED``) in this transaction. The
    ledger is not touched here: the caller adds the holds' amounts last.
    """
    lost: set[uuid.UUID] = set()
    events: list[dict[str, Any]] = []
    for p in sorted(preemptions, key=lambda p: p.task_id):
        victims = sorted(set(p.victims))
        rows = await conn.fetch(_REVOKE, victims, p.revoke_by, p.task_id)
        if {r[0] for r in rows} != set(victims):
            lost.add(p.task_id)
            continue
        await conn.execute(
            _HOLDS_INSERT, p.task_id, now,
            [h[0] for h in p.holds], [h[1] for h in p.holds],
            [h[2][0] for h in p.holds], [h[2][1] for h in p.holds], [h[2][2] for h in p.holds],
        )
        deadline = p.revoke_by.isoformat()
        events += [
            {"task_id": v, "from_state": "LEASED", "to_state": "LEASED", "reason": REVOKING,
             "detail": {"preemptorId": str(p.task_id), "revokeBy": deadline}}
            for v in victims
        ]
    if events:
        await task_events_add(conn, rows=events, now=now)
    return lost


# --- when a lease ends -------------------------------------------------------------------

_LEASES_END = (
    "UPDATE leases SET state = $2, ended_at = $4, end_reason = $3 "
    "WHERE task_id = ANY($1::uuid[]) AND state IN ('ACTIVE', 'REVOKING') "
    "RETURNING task_id, CASE WHEN revoke_by IS NOT NULL THEN preempted_by END"
)


async def leases_end(
    conn: Connection,
    *,
    task_ids: Collection[uuid.UUID],
    state: str,
    reason: str,
    now: datetime,
) -> dict[uuid.UUID, uuid.UUID]:
    """End the live leases (active or revoking) of ``task_ids`` as ``state``; return the
    preemptor of each task whose leases were revoking (its heir)."""
    if not task_ids:
        return {}
    rows = await conn.fetch(_LEASES_END, list(task_ids), state, reason, now)
    return {r[0]: r[1] for r in rows if r[1] is not None}


_HEIRS_LOCK = (
    "SELECT id FROM tasks WHERE id = ANY($1::uuid[]) AND state = 'ADMITTED' "
    "ORDER BY id FOR NO KEY UPDATE"
)
# Victims' rows on pools where their heir holds a row move into the heir's row.
_HAND_OVER = (
    "WITH h AS (SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS h(victim, heir)), "
    "moved AS (DELETE FROM reservations r USING h WHERE r.task_id = h.victim "
    "AND EXISTS (SELECT 1 FROM reservations x WHERE x.task_id = h.heir "
    "AND x.pool_id = r.pool_id) "
    "RETURNING h.heir, r.task_id AS victim, r.pool_id, r.cpu, r.memory, r.llm), "
    # The victims' leases ended: their quota usage goes back (app.ledger.quotas).
    "gone AS (SELECT victim AS task_id, pool_id, cpu, memory, llm FROM moved), "
    + RETURN_CTES
    + ", m AS (SELECT heir, pool_id, sum(cpu) AS cpu, sum(memory) AS memory, sum(llm) AS llm "
    "FROM moved GROUP BY heir, pool_id) "
    "UPDATE reservations x SET cpu = x.cpu + m.cpu, memory = x.memory + m.memory, "
    "llm = x.llm + m.llm FROM m WHERE x.task_id = m.heir AND x.pool_id = m.pool_id "
    "AND (SELECT n FROM gone_cohort) >= 0 "
    "RETURNING x.task_id"
)
_HEIRS_UNPARK = (
    "UPDATE tasks t SET parked = false, updated_at = $2 WHERE t.id = ANY($1::uuid[]) "
    "AND t.state = 'ADMITTED' AND t.parked AND NOT EXISTS (SELECT 1 FROM leases l "
    "WHERE l.preempted_by = t.id AND l.state = 'REVOKING') RETURNING t.id"
)


async def reservations_hand_over(
    conn: Connection,
    *,
    task_ids: Collection[uuid.UUID],
    heirs: Mapping[uuid.UUID, uuid.UUID],
    now: datetime,
) -> dict[str, Vector]:
    """Release the reservations of ``task_ids`` (whose leases just ended), handing those of
    victims over to their waiting preemptors; return what went back to the ledger by pool.

    A preemptor that is no longer waiting (placed, cancelled, failed) inherits nothing. A
    preemptor whose last victim ended is unparked, and reconcilers are woken. What is free
    afterwards on a nominated pool goes into its nominee's hold, up to its need.
    """
    heirs = {v: h for v, h in heirs.items() if v in set(task_ids)}
    woken = False
    if heirs:
        alive = {r[0] for r in await conn.fetch(_HEIRS_LOCK, sorted(set(heirs.values())))}
        pairs = sorted((v, h) for v, h in heirs.items() if h in alive)
        if pairs:
            await conn.fetch(_HAND_OVER, [v for v, _ in pairs], [h for _, h in pairs])
            woken = bool(await conn.fetch(_HEIRS_UNPARK, sorted(alive), now))
    # Nominated pools keep what is free on them for their nominees (app.ledger.nominations).
    nominees = await nominees_lock(conn, task_ids=task_ids)
    released = await reservations_release(conn, task_ids=task_ids, now=now)
    if nominees:
        released = await nominations_capture(
            conn, nominees=nominees, released=released, now=now
        )
    if woken and not released:
        await wakeup_notify(conn, source=WakeSource.CAPACITY_RELEASED)
    return released


# --- the leader's rounds -----------------------------------------------------------------

_OVERDUE = (
    "SELECT DISTINCT task_id FROM (SELECT task_id FROM leases WHERE state = 'REVOKING' "
    "AND revoke_by <= $1 ORDER BY revoke_by LIMIT $2) o"
)
# ``(state = 'LEASED') IS TRUE``, not ``state = 'LEASED'``: that clause is the predicate of
# ``ix_tasks_leased_tenant``, which the planner would read whole (every leased task) and
# filter by id when the statistics predate the leases (see ``_UNLEASE`` in app.ledger.claims).
_VICTIMS_LOCK = (
    "SELECT id FROM tasks WHERE id = ANY($1::uuid[]) AND (state = 'LEASED') IS TRUE "
    "ORDER BY id FOR UPDATE SKIP LOCKED"
)
_VICTIMS_REQUEUE = (
    "UPDATE tasks SET state = 'ADMITTED', preemptions = preemptions + 1, parked = false, "
    "pending_reason = NULL, placement = NULL, leased_at = NULL, updated_at = $2 "
    "WHERE id = ANY($1::uuid[]) RETURNING id, preemptions"
)


async def victims_revoke_overdue(conn: Connection, *, now: datetime, limit: int = 500) -> int:
    """Revoke the revoking leases past their deadline and requeue their tasks without using an
    attempt, handing their capacity to their preemptors; return how many tasks."""
    ids = [r[0] for r in await conn.fetch(_OVERDUE, now, limit)]
    if not ids:
        return 0
    locked = [r[0] for r in await conn.fetch(_VICTIMS_LOCK, sorted(ids))]
    if not locked:
        return 0
    heirs = await leases_end(conn, task_ids=locked, state="REVOKED", reason=PREEMPTED, now=now)
    rows = await conn.fetch(_VICTIMS_REQUEUE, locked, now)
    # A victim of another tenant's task was reclaimed (app.ledger.reclaim), not preempted.
    reclaimed = await reclaimed_of(conn, heirs=heirs)
    await task_events_add(
        conn,
        rows=[
            {"task_id": r[0], "from_state": "LEASED", "to_state": "ADMITTED",
             "reason": RECLAIMED if r[0] in reclaimed else PREEMPTED,
             "detail": {"preemptorId": str(heirs[r[0]]) if r[0] in heirs else None,
                        "preemptions": int(r[1])}}
            for r in rows
        ],
        now=now,
    )
    released = await reservations_hand_over(conn, task_ids=locked, heirs=heirs, now=now)
    await wakeup_notify(conn, source=WakeSource.CAPACITY_RELEASED if released
                        else WakeSource.SUBMITTED)
    return len(rows)


_PREEMPTORS_UNPARK = (
    "UPDATE tasks t SET parked = false, updated_at = $1 WHERE t.state = 'ADMITTED' "
    "AND t.parked AND t.pending_reason ->> 'code' IN ('preempting', 'reclaiming') "
    "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.preempted_by = t.id "
    "AND l.state = 'REVOKING') RETURNING t.id"
)


async def preemptors_unpark(conn: Connection, *, now: datetime) -> int:
    """Unpark the preemptors none of whose victims is still revoking (the safety net of the
    hand-over's own unpark); return how many."""
    rows = await conn.fetch(_PREEMPTORS_UNPARK, now)
    if rows:
        await wakeup_notify(conn, source=WakeSource.CAPACITY_RELEASED)
    return len(rows)
