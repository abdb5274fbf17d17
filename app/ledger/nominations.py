"""Nominations in the ledger: capacity freed on a starving task's pools is held for it.

A task that has been first of its priority in its runtime class and has not fit for longer
than the nomination time is *nominated* by a pass (:mod:`app.scheduling.displacement.nominate`): one
``nominations`` row per pool it would take (one nomination per pool at a time: the primary
key), naming the members it would place there and what they need. The capacity itself is
held like a preemptor's, in hold rows of ``reservations``, reserved in the ledger like any
reservation, so nothing else can take it and the ledger still equals the sum of its rows:

* at nomination, the pass holds the free part of the need at once (a preemption without
  victims, applied by :func:`app.ledger.plans.plan_apply`);
* **capture** (:func:`nominees_lock` then :func:`nominations_capture`, from
  :func:`app.ledger.preemption.reservations_hand_over`, wherever a lease ends): once the
  ended leases' reservations are released, what is free on a nominated pool goes into the
  nominee's hold there, up to its need. A nominee whose holds cover its need is unparked;
  its pass places it on them (:func:`app.ledger.preemption.holds_take`);
* a nominee placed, no longer first, or passed by higher-ranked work gives its holds back
  in its pass (the same ``holds_take``); a cancelled one releases them with its
  reservations at once (its nomination rows are removed by the next recovery round);
* **recovery** (:func:`nominations_recover`, the leader's round): nominations whose task is
  no longer admitted are removed, and hold rows whose task is no longer admitted (or gone)
  are released.

Lock order as everywhere: task rows (the ending task's, then the nominees', ``FOR NO KEY
UPDATE``), then reservation rows, then the ledger. A pass holds its claimed nominee locked, so
a lease ending on a nominated pool meanwhile waits for that pass to commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from app.db import Connection
from app.ledger.events import task_events_add
from app.ledger.reservations import Vector, ledger_release_many, ledger_reserve_many
from app.ledger.wakeups import WakeSource, wakeup_notify
from app.scheduling.records import NOMINATED, Nomination

__all__ = [
    "NOMINATED",
    "NOMINATION_ENDED",
    "Nomination",
    "class_head",
    "class_heads_read",
    "lower_usage_read",
    "nominations_capture",
    "nominations_delete",
    "nominations_held",
    "nominations_insert",
    "nominations_read",
    "nominations_recover",
    "nominees_lock",
    "nominees_release",
]

#: Event reason of a nomination that ended (the outcome in its detail).
NOMINATION_ENDED = "nomination_ended"


_READ = (
    "SELECT n.pool_id, n.task_id, n.runtime_class, n.members, n.cpu, n.memory, n.llm, "
    "n.created_at, t.priority, t.seq, t.state FROM nominations n "
    "JOIN tasks t ON t.id = n.task_id ORDER BY n.pool_id"
)


async def nominations_read(conn: Connection) -> list[Nomination]:
    """Return every nomination (one row per nominated pool; there are few)."""
    return [
        Nomination(r[0], r[1], r[2], int(r[3]), (int(r[4]), int(r[5]), int(r[6])), r[7],
                   int(r[8]), int(r[9]), r[10])
        for r in await conn.fetch(_READ)
    ]


# The predicate of ``ix_tasks_queue_seq`` (app.ledger.tables.COMPETING, repeated here: a
# reconciler does not import the table definitions).
_COMPETING = (
    "state IN ('ADMITTED', 'CLAIMED') AND (pending_stage IS NULL OR pending_stage >= 4)"
)
# Reads ``ix_tasks_queue_seq`` (the competing queue of the class: tasks that released
# capacity could help) for a task ranked above the candidate: one of a higher priority or
# admitted before it of the same priority ($5 true: the priority policy), or one admitted
# before it (in admission order).
_HEAD = (
    "SELECT NOT EXISTS (SELECT 1 FROM tasks WHERE runtime_class = $1 AND " + _COMPETING
    + " AND NOT (id = ANY($4::uuid[])) "
    "AND CASE WHEN $5 THEN priority > $2 OR (priority = $2 AND seq < $3) ELSE seq < $3 END)"
)


async def class_head(
    conn: Connection, *, task_id: uuid.UUID, runtime_class: str, priority: int, seq: int,
    by_priority: bool, placed: Collection[uuid.UUID] = (),
) -> bool:
    """Return whether no waiting task of the class ranks above the task: none of a higher
    priority nor of its own admitted before it (``by_priority``), or none admitted before
    it; ``placed`` (tasks the caller's pass is placing) do not count. Work ranked above a
    nominee is never held back."""
    return bool(await conn.fetchval(
        _HEAD, runtime_class, priority, seq, [task_id, *placed], by_priority
    ))


# The first competing tasks of a class in rank order: admission order, or priority first
# ($3 true: the priority policy). Read through ``ix_tasks_queue_seq`` in admission order.
_HEADS = (
    "SELECT c.rc, x.id, x.priority, x.seq FROM unnest($1::text[]) AS c(rc) "
    "CROSS JOIN LATERAL (SELECT id, priority, seq FROM tasks WHERE runtime_class = c.rc AND "
    + _COMPETING + " ORDER BY seq LIMIT $2) x WHERE NOT $3"
)
_HEADS_PRIORITY = (
    "SELECT c.rc, x.id, x.priority, x.seq FROM unnest($1::text[]) AS c(rc) "
    "CROSS JOIN LATERAL (SELECT id, priority, seq FROM tasks WHERE runtime_class = c.rc AND "
    + _COMPETING + " ORDER BY priority DESC, seq LIMIT $2) x WHERE $3"
)


async def class_heads_read(
    conn: Connection, *, runtime_classes: Collection[str], limit: int, by_priority: bool,
) -> dict[str, tuple[tuple[uuid.UUID, int, int], ...]]:
    """Return per runtime class its first ``limit`` competing tasks (id, priority, seq) in
    rank order: priority, then admission (``by_priority``), or admission only."""
    if not runtime_classes:
        return {}
    rows = await conn.fetch(_HEADS_PRIORITY if by_priority else _HEADS,
                            sorted(set(runtime_classes)), limit, by_priority)
    out: dict[str, list[tuple[uuid.UUID, int, int]]] = {}
    for r in rows:
        out.setdefault(r[0], []).append((r[1], int(r[2]), int(r[3])))
    def rank(h: tuple[uuid.UUID, int, int]) -> tuple[int, int]:
        return (-h[1], h[2]) if by_priority else (0, h[2])

    return {rc: tuple(sorted(heads, key=rank)) for rc, heads in out.items()}


# What the live leases of tasks ranked below the nominee (a lower priority, or the same
# priority admitted later, with ``by_priority``; else admitted later) reserve on each pool.
_LOWER = (
    "SELECT l.pool_id, sum(r.cpu), sum(r.memory), sum(r.llm) FROM leases l "
    "JOIN reservations r ON r.task_id = l.task_id AND r.pool_id = l.pool_id "
    "JOIN tasks t ON t.id = l.task_id "
    "WHERE l.pool_id = ANY($1::text[]) AND l.state IN ('ACTIVE', 'REVOKING') AND NOT r.hold "
    "AND CASE WHEN $4 THEN t.priority < $2 OR (t.priority = $2 AND t.seq > $3) "
    "ELSE t.seq > $3 END GROUP BY l.pool_id"
)


async def lower_usage_read(
    conn: Connection, *, pool_ids: Collection[str], priority: int, seq: int, by_priority: bool
) -> dict[str, Vector]:
    """Return per pool what work ranked below (``priority``, ``seq``) reserves there."""
    if not pool_ids:
        return {}
    rows = await conn.fetch(_LOWER, sorted(pool_ids), priority, seq, by_priority)
    return {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in rows}


_INSERT = (
    "INSERT INTO nominations (pool_id, task_id, runtime_class, members, cpu, memory, llm, "
    "created_at) SELECT n.pool_id, $1, $2, n.members, n.cpu, n.memory, n.llm, $3 "
    "FROM unnest($4::text[], $5::int[], $6::bigint[], $7::bigint[], $8::bigint[]) "
    "AS n(pool_id, members, cpu, memory, llm) ON CONFLICT (pool_id) DO NOTHING "
    "RETURNING pool_id"
)
_DELETE = "DELETE FROM nominations WHERE task_id = ANY($1::uuid[]) RETURNING task_id"


async def nominations_insert(
    conn: Connection,
    *,
    task_id: uuid.UUID,
    runtime_class: str,
    members: Sequence[tuple[str, int, Vector]],
    now: datetime,
) -> bool:
    """Nominate ``task_id`` (its lock held) on the pools of ``members`` (pool, members,
    need); return False, writing nothing, when another task holds one of those pools."""
    pools = [m[0] for m in members]
    rows = await conn.fetch(
        _INSERT, task_id, runtime_class, now, pools, [m[1] for m in members],
        [m[2][0] for m in members], [m[2][1] for m in members], [m[2][2] for m in members],
    )
    if len(rows) == len(pools):
        return True
    if rows:
        await conn.execute(_DELETE, [task_id])
    return False


async def nominations_delete(
    conn: Connection, *, task_ids: Collection[uuid.UUID]
) -> set[uuid.UUID]:
    """Delete the nominations of ``task_ids``; return the tasks that had one."""
    if not task_ids:
        return set()
    return {r[0] for r in await conn.fetch(_DELETE, sorted(task_ids))}


_RELEASE_LOCK = (
    "SELECT id FROM tasks WHERE id = ANY($1::uuid[]) AND state = 'ADMITTED' "
    "ORDER BY id FOR NO KEY UPDATE SKIP LOCKED"
)
_UNPARK = "UPDATE tasks SET parked = false, updated_at = $2 WHERE id = ANY($1::uuid[])"


async def nominees_release(
    conn: Connection, *, task_ids: Collection[uuid.UUID], now: datetime
) -> set[uuid.UUID]:
    """Lock the nominees of ``task_ids`` that no other transaction holds and unpark them
    (their nomination is ending: they are looked at again); return those locked. The
    caller gives their holds back (:func:`app.ledger.preemption.holds_take`)."""
    if not task_ids:
        return set()
    locked = [r[0] for r in await conn.fetch(_RELEASE_LOCK, sorted(task_ids))]
    if locked:
        await conn.execute(_UNPARK, locked, now)
    return set(locked)


# --- capture, wherever a lease ends ------------------------------------------------------

# The admitted nominees of the pools where ``$1`` hold reservations (not ``$1`` themselves),
# locked. The nominations table is empty unless a task starves: then this is a few rows.
_NOMINEES_LOCK = (
    "SELECT t.id FROM tasks t WHERE t.id IN (SELECT n.task_id FROM nominations n "
    "WHERE n.pool_id IN (SELECT r.pool_id FROM reservations r "
    "WHERE r.task_id = ANY($1::uuid[]))) "
    "AND t.state = 'ADMITTED' AND NOT (t.id = ANY($1::uuid[])) ORDER BY t.id FOR NO KEY UPDATE"
)


async def nominees_lock(conn: Connection, *, task_ids: Collection[uuid.UUID]) -> list[uuid.UUID]:
    """Lock and return the admitted nominees of the pools ``task_ids`` reserve on (call it
    before their reservations are released)."""
    if not task_ids:
        return []
    return [r[0] for r in await conn.fetch(_NOMINEES_LOCK, list(task_ids))]


# Per nominated pool of the nominees, among ``$2``: what the hold lacks, bounded by what is
# free now (the caller holds those ledger rows locked since it released on them).
_MISSING = (
    "SELECT n.task_id, n.pool_id, n.members, "
    "greatest(0, least(n.cpu - coalesce(r.cpu, 0), l.cpu_total - l.cpu_reserved)), "
    "greatest(0, least(n.memory - coalesce(r.memory, 0), l.memory_total - l.memory_reserved)), "
    "greatest(0, least(n.llm - coalesce(r.llm, 0), l.llm_total - l.llm_reserved)) "
    "FROM nominations n JOIN ledgers l ON l.pool_id = n.pool_id "
    "LEFT JOIN reservations r ON r.task_id = n.task_id AND r.pool_id = n.pool_id "
    "WHERE n.task_id = ANY($1::uuid[]) AND n.pool_id = ANY($2::text[]) "
    "ORDER BY n.pool_id"
)
_HOLDS_ADD = (
    "INSERT INTO reservations AS x (task_id, pool_id, members, cpu, memory, llm, created_at, "
    "hold) SELECT h.task_id, h.pool_id, h.members, h.cpu, h.memory, h.llm, $7, true "
    "FROM unnest($1::uuid[], $2::text[], $3::int[], $4::bigint[], $5::bigint[], "
    "$6::bigint[]) AS h(task_id, pool_id, members, cpu, memory, llm) "
    "ON CONFLICT (task_id, pool_id) DO UPDATE SET cpu = x.cpu + excluded.cpu, "
    "memory = x.memory + excluded.memory, llm = x.llm + excluded.llm"
)
# The nominees' holds against their need: the pending reason shows them; a nominee whose
# holds cover its need on every nominated pool is unparked.
_NOMINEES_UPDATE = (
    "WITH h AS (SELECT n.task_id, "
    "bool_and(coalesce(r.cpu >= n.cpu AND r.memory >= n.memory AND r.llm >= n.llm, false)) "
    "AS full, coalesce(sum(r.cpu), 0) AS cpu, coalesce(sum(r.memory), 0) AS memory, "
    "coalesce(sum(r.llm), 0) AS llm FROM nominations n LEFT JOIN reservations r "
    "ON r.task_id = n.task_id AND r.pool_id = n.pool_id "
    "WHERE n.task_id = ANY($1::uuid[]) GROUP BY n.task_id) "
    "UPDATE tasks t SET parked = t.parked AND NOT h.full, updated_at = $2, "
    "pending_reason = CASE WHEN t.pending_reason ->> 'code' = 'nominated' "
    "THEN jsonb_set(t.pending_reason, '{held}', jsonb_build_object('cpuMillis', h.cpu, "
    "'memoryMiB', h.memory, 'llmSlots', h.llm)) ELSE t.pending_reason END "
    "FROM h WHERE t.id = h.task_id RETURNING t.id, h.full"
)


async def nominations_capture(
    conn: Connection,
    *,
    nominees: Collection[uuid.UUID],
    released: Mapping[str, Vector],
    now: datetime,
) -> dict[str, Vector]:
    """Move what is free on the nominated pools among ``released`` (whose ledger rows the
    caller just released on, and so holds locked) into the locked ``nominees``' holds, up to
    their need; return ``released`` less what was held again."""
    if not nominees or not released:
        return dict(released)
    rows = await conn.fetch(_MISSING, sorted(nominees), sorted(released))
    take = [r for r in rows if r[3] or r[4] or r[5]]
    if not take:
        return dict(released)
    await conn.execute(
        _HOLDS_ADD, [r[0] for r in take], [r[1] for r in take], [int(r[2]) for r in take],
        [int(r[3]) for r in take], [int(r[4]) for r in take], [int(r[5]) for r in take], now,
    )
    held: dict[str, list[int]] = {}
    for r in take:
        acc = held.setdefault(r[1], [0, 0, 0])
        acc[0] += int(r[3])
        acc[1] += int(r[4])
        acc[2] += int(r[5])
    await ledger_reserve_many(
        conn, amounts={p: (a[0], a[1], a[2]) for p, a in held.items()}, now=now, wait=False
    )
    updated = await conn.fetch(_NOMINEES_UPDATE, sorted({r[0] for r in take}), now)
    if any(r[1] for r in updated):
        await wakeup_notify(conn, source=WakeSource.SUBMITTED)
    out: dict[str, Vector] = {}
    for p, a in released.items():
        h = held.get(p, (0, 0, 0))
        rest = (a[0] - h[0], a[1] - h[1], a[2] - h[2])
        if any(x > 0 for x in rest):
            out[p] = (max(rest[0], 0), max(rest[1], 0), max(rest[2], 0))
    return out


# --- the leader's round ------------------------------------------------------------------

_STALE = (
    "DELETE FROM nominations n WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = n.task_id "
    "AND t.state = 'ADMITTED') RETURNING n.task_id"
)
_STATES = "SELECT id, state FROM tasks WHERE id = ANY($1::uuid[])"
# Holds of tasks no longer admitted, or gone: capacity held for nothing.
_ORPHANS = (
    "DELETE FROM reservations r WHERE r.hold AND NOT EXISTS (SELECT 1 FROM tasks t "
    "WHERE t.id = r.task_id AND t.state = 'ADMITTED') RETURNING pool_id, cpu, memory, llm"
)


async def nominations_recover(conn: Connection, *, now: datetime) -> dict[str, int]:
    """Remove the nominations of tasks no longer admitted and release every hold whose
    task is no longer admitted; return the nominations ended by outcome (``cancelled``,
    ``placed`` or ``gone``)."""
    ended = sorted({r[0] for r in await conn.fetch(_STALE)})
    states = {r[0]: r[1] for r in await conn.fetch(_STATES, ended)} if ended else {}
    outcomes: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    for task_id in ended:
        state = states.get(task_id)
        outcome = ("cancelled" if state == "CANCELLED" else "placed" if state == "LEASED"
                   else "gone")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if state is not None:
            events.append({"task_id": task_id, "from_state": state, "to_state": state,
                           "reason": NOMINATION_ENDED, "detail": {"outcome": outcome}})
    if events:
        await task_events_add(conn, rows=events, now=now)
    released: dict[str, list[int]] = {}
    for r in await conn.fetch(_ORPHANS):
        acc = released.setdefault(r[0], [0, 0, 0])
        acc[0] += int(r[1])
        acc[1] += int(r[2])
        acc[2] += int(r[3])
    if released:
        amounts = {p: (a[0], a[1], a[2]) for p, a in released.items()}
        await ledger_release_many(conn, amounts=amounts, now=now)
        await wakeup_notify(conn, source=WakeSource.CAPACITY_RELEASED, pools=amounts)
    return outcomes


_HELD = (
    "SELECT coalesce(sum(r.cpu), 0), coalesce(sum(r.memory), 0), coalesce(sum(r.llm), 0) "
    "FROM reservations r WHERE r.hold AND r.task_id IN (SELECT task_id FROM nominations)"
)


async def nominations_held(conn: Connection) -> Vector:
    """Return the capacity held for nominees, summed over every pool."""
    r = await conn.fetchrow(_HELD)
    return (int(r[0]), int(r[1]), int(r[2]))

