"""Claims: the row locks a pass holds on the admitted tasks it schedules, and how it applies
its decisions to them.

A pass runs in one transaction (:mod:`app.reconciler.passes`). :func:`tasks_claim` selects up
to ``batch`` admitted, unparked tasks of the owned slots ``FOR UPDATE SKIP LOCKED``: the row
locks *are* the claim (docs/decisions/0006-claims-are-row-locks.md). Nothing is written to
claim: concurrent reconcilers skip each other's locked rows, a pass that dies (its process
killed, its connection lost, its session ended by ``idle_in_transaction_session_timeout``)
aborts and the rows are claimable again at once, and nothing was leaked. The claim order is
the policy's:

* ``fifo`` — admission order;
* ``priority`` — effective priority (priority plus aging) among the highest raw priorities
  and the oldest tasks, so an aged low-priority task is not starved out of the batch;
* ``fair`` — at most ``ceil(batch / tenants present)`` tasks per tenant, so one tenant's deep
  backlog cannot fill the batch; the rest of the batch is then filled in admission order.

Every claim reads only the partial indexes of admitted, unparked tasks: its cost does not
grow with finished tasks kept in the table.

:func:`tasks_lease` marks granted tasks ``LEASED`` with their reservations, leases and one
``leased`` event in one statement; :func:`tasks_unlease` undoes that for the few tasks whose
pools refused their amounts (the pass walks them or hands them back);
:func:`tasks_unclaim` parks the tasks that fit nowhere. All of them touch only rows the pass
holds locked.

**Events grow with changes, not with time.** A claim writes no event. A task that
already carries a pending reason (it was parked, then woken) and is found pending for the
same reason code is parked again with no event at all (its pending reason, wake keys and
stage are refreshed in place); any other outcome writes one event (``leased``, the new
reason, a lost race). The pass decides (:mod:`app.reconciler.passes`) and
:func:`tasks_unclaim` records in ``logged_code`` and ``logged_at`` the pending code each
event logged and when, so that a re-examined task's reason changes can be logged at most
once per park sweep period.

``tasks_wake`` and ``tasks_unpark`` make parked tasks claimable again: the first only those
whose wake keys (:mod:`app.scheduling.parking`) overlap a wakeup's, the second all of a set
of slots (the safety sweep).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

import orjson

from app.config import SHARD_SLOTS
from app.cpu_phases import cpu_phase
from app.db import Connection
from app.ledger.literals import (
    ids_joined,
    ints_joined,
    plain_joined,
    texts_joined,
    uuids_joined,
)
from app.ledger.quotas import QUOTA_LOCK
from app.ledger.retention import task_events_trim
from app.ledger.tasks import uuid7_prefix
from app.scheduling.records import ClaimedTask, Grant, Unclaim

#: Most tenants the fair claim looks at in one pass.
FAIR_TENANTS_MAX = 512


# ``spec`` is ``json`` (revision 0013_spec_json, decision 13): ``spec::text`` copies the stored
# text, where a ``jsonb`` column rebuilt it per claimed task (a third of the claim's work).
_COLUMNS = (
    "id, tenant_id, seq, priority, spec::text, admitted_at, attempts, "
    "pending_reason ->> 'code', pending_reason::text, pending_stage, logged_code, logged_at, "
    "logged_count"
)
_CLAIMABLE = "state = 'ADMITTED' AND NOT parked AND shard = ANY($1::int[])"

# $1 slots, $2 limit, $3 ids this transaction locked already (SKIP LOCKED does not skip
# rows locked by the transaction itself).
_CLAIM_FIFO = (
    f"SELECT {_COLUMNS} FROM tasks WHERE {_CLAIMABLE} AND id <> ALL($3::uuid[]) "
    "ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED"
)

# $1 slots, $2 limit, $3 now, $4 aging seconds. The candidates (the highest raw priorities
# and the oldest) are computed once and fetched through the primary key: no join over every
# claimable task.
_CLAIM_PRIORITY = (
    f"SELECT {_COLUMNS} FROM tasks WHERE id = ANY(ARRAY("
    f"SELECT id FROM (SELECT id FROM tasks WHERE {_CLAIMABLE} "
    "ORDER BY priority DESC, seq LIMIT $2) top "
    f"UNION SELECT id FROM (SELECT id FROM tasks WHERE {_CLAIMABLE} "
    "ORDER BY seq LIMIT $2) old)) AND state = 'ADMITTED' AND NOT parked "
    "ORDER BY priority + EXTRACT(EPOCH FROM ($3::timestamptz - admitted_at)) "
    "/ $4::float8 DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED"
)

# Loose index scan over ix_tasks_claim_tenant: one probe per (slot, tenant) in the queue.
# $1 lo, $2 hi, $3 slots, $4 tenants.
_FAIR_TENANTS = (
    "WITH RECURSIVE q AS ("
    "(SELECT shard, tenant_id FROM tasks WHERE state = 'ADMITTED' AND NOT parked "
    "AND shard >= $1 ORDER BY shard, tenant_id LIMIT 1) "
    "UNION ALL "
    "SELECT n.shard, n.tenant_id FROM q CROSS JOIN LATERAL ("
    "SELECT shard, tenant_id FROM tasks WHERE state = 'ADMITTED' AND NOT parked "
    "AND (shard, tenant_id) > (q.shard, q.tenant_id) ORDER BY shard, tenant_id LIMIT 1) n "
    "WHERE q.shard < $2) "
    "SELECT shard, tenant_id FROM q WHERE shard < $2 AND shard = ANY($3::int[]) "
    "LIMIT $4"
)

# $1 shards, $2 tenants, $3 per tenant, $4 limit.
_CLAIM_FAIR = (
    "WITH q AS (SELECT * FROM unnest($1::int[], $2::text[]) AS q(shard, tenant_id)) "
    "SELECT x.* FROM q CROSS JOIN LATERAL (SELECT " + _COLUMNS + " FROM tasks "
    "WHERE shard = q.shard AND tenant_id = q.tenant_id AND state = 'ADMITTED' AND NOT parked "
    "ORDER BY seq LIMIT $3 FOR UPDATE SKIP LOCKED) x LIMIT $4"
)


# A pass's statements take arrays of a thousand ids joined through unnest(). A generic plan
# (cached after five runs) guesses 10 elements per array and joins them in a nested loop:
# quadratic in the batch (1,024 x 1,024 comparisons per statement, seconds per pass once
# the table is large). Custom plans see the arrays and cost a millisecond to plan.
# JIT compilation is off: a pass's statements are short, and one whose estimated cost passes
# ``jit_above_cost`` (the tenant usage read of the ``fair`` policy, at 20,000 live
# reservations) spent about 21 ms compiling per run, more than it then ran.
# The shared quota lock orders the pass against quota rebuilds (app.ledger.quotas): the
# quota rows the pass reads and charges cannot be rebuilt under it.
_PASS_SETTINGS = (
    "SELECT set_config('idle_in_transaction_session_timeout', $1, true), "
    "set_config('plan_cache_mode', 'force_custom_plan', true), set_config('jit', 'off', true), "
    f"pg_advisory_xact_lock_shared({QUOTA_LOCK})"
)


async def claims_settings(conn: Connection, *, idle_seconds: float) -> None:
    """Set up the caller's transaction for a pass: the server ends the session if the
    transaction (holding its claims) sits idle longer than ``idle_seconds`` — a hung
    reconciler's claims then return to the queue — statements are planned for the
    arrays they get, without JIT compilation, and the shared quota lock is taken."""
    await conn.execute(_PASS_SETTINGS, f"{max(int(idle_seconds * 1000), 1)}ms")


def _claimed(rows: Sequence[Any]) -> list[ClaimedTask]:
    # tuple.__new__ straight from each record: ``_make`` is a Python call per claimed row
    # (the columns are the named tuple's fields, in order).
    new = tuple.__new__
    return [new(ClaimedTask, r) for r in rows]


async def tasks_claim(
    conn: Connection,
    *,
    slots: Collection[int],
    batch: int,
    now: datetime,
    policy: str = "fifo",
    aging_seconds: float = 60.0,
    fair_rotation: int = 0,
) -> list[ClaimedTask]:
    """Lock up to ``batch`` claimable tasks of ``slots`` in the caller's transaction (the
    claim lasts until it ends) and return them in claim order.

    ``fair_rotation`` picks the slot where the fair claim starts listing tenants (pass a
    counter: the start moves every pass).
    """
    if not slots or batch <= 0:
        return []
    owned = sorted(slots)
    claimed: list[ClaimedTask] = []
    left = batch
    if policy == "fair":
        # Start at a rotating slot: with more tenants than FAIR_TENANTS_MAX, every tenant
        # still gets its turn at the head of the enumeration.
        start = fair_rotation % SHARD_SLOTS
        tenants = list(await conn.fetch(_FAIR_TENANTS, start, SHARD_SLOTS, owned,
                                        FAIR_TENANTS_MAX))
        if start and len(tenants) < FAIR_TENANTS_MAX:
            tenants += await conn.fetch(_FAIR_TENANTS, 0, start, owned,
                                        FAIR_TENANTS_MAX - len(tenants))
        if tenants:
            per_tenant = math.ceil(left / len(tenants))
            claimed = _claimed(await conn.fetch(
                _CLAIM_FAIR, [int(t[0]) for t in tenants], [t[1] for t in tenants],
                per_tenant, left,
            ))
            left = batch - len(claimed)
    elif policy == "priority":
        claimed = _claimed(await conn.fetch(
            _CLAIM_PRIORITY, owned, left, now, float(aging_seconds)
        ))
        left = batch - len(claimed)
    if left > 0:
        claimed += _claimed(
            await conn.fetch(_CLAIM_FIFO, owned, left, [t.id for t in claimed])
        )
    return claimed


# $1 now, $2 expires, $3 ids, $4 placements (JSON text), $5 first pools, $6..$12 the member rows,
# $13 the lease ids' prefix (below). The member rows' columns are delimited texts
# (app.ledger.literals); the instances too unless one of them contains the delimiter (then
# they go as a list, in :data:`_LEASE_LISTED`): a list costs the driver about a microsecond
# per member row to encode. A member row names its task by the task's position in
# $3 (from 1: ``g``'s ordinality, returned by the update), not by its id again: one integer to
# parse instead of another parse of every UUID. The ``t.id = ANY(ARRAY(SELECT id FROM g))``
# condition lets the planner reach the rows through the primary key whatever it estimates for the
# unnest (never a scan of every task ever kept), with the ids ``g`` has parsed: each UUID of $3 is
# parsed once, not again for this condition. The placement is stored as the text the reconciler
# wrote (decision 11: not parsed again, nothing searches it).
# ``id`` and ``tenant_id`` are assigned their own values. The update is never HOT (``state`` is in
# the claim indexes' predicates), and PostgreSQL marks the index insertions of an UPDATE whose SET
# list does not name an index's columns "key unchanged": a full leaf page of ``pk_tasks``,
# ``ix_tasks_tenant_seq`` or ``ix_tasks_leased_tenant`` then first tries a bottom-up deletion,
# whose candidates are the versions this statement supersedes (never removable yet), always in
# vain (decision 12).
# Naming the columns changes no value, row lock or HOT decision (PostgreSQL compares the values
# for those).
# A lease's id is a UUIDv7 made of $13 (``uuid7_prefix``: the pass's millisecond), the version
# digit, 50 random bits of ONE ``gen_random_uuid()`` per statement (its characters 16-30: three
# hex digits, the variant group, six hex digits) and the member row's position as six hex digits
# (0x100000 + k: six digits for any statement of fewer than 15 M member rows).
# One ``gen_random_uuid()`` per statement rather than per lease: pg_strong_random is costly. The
# ids of a pass are distinct by their positions, and grow with time: its leases append next to
# each other in ``pk_leases``. Lease ids are not secrets (decision 16).
# The event's detail is written as JSON text (cheaper for the server than
# ``jsonb_build_object``): a pool id needs no escaping, since ``ck_pools_id_slug`` admits only
# [a-z0-9-] and the pools come from the pass's snapshot of ``pools``.
# The events' task ids and ids come back as two arrays in one row (NULLs when nothing was
# leased): the driver decodes them for about three quarters of the CPU of a row per event.
_LEASE = (
    "WITH g AS (SELECT * FROM unnest(string_to_array($3::text, ',')::uuid[], "
    "string_to_array($4::text, E'\\x1e'), string_to_array($5::text, ',')) "
    "WITH ORDINALITY AS g(id, placement, pool_id, k)), "
    "u AS (UPDATE tasks t SET id = t.id, tenant_id = t.tenant_id, state = 'LEASED', "
    "placement = g.placement, "
    "leased_at = $1, pending_reason = NULL, parked = false, wake = NULL, "
    "pending_stage = NULL, updated_at = $1 FROM g "
    "WHERE t.id = ANY(ARRAY(SELECT id FROM g)) AND t.id = g.id "
    "AND t.state = 'ADMITTED' "
    "RETURNING t.id, t.attempts + t.preemptions AS attempts, g.pool_id, g.k), "
    "m AS (SELECT * FROM unnest(string_to_array($6::text, ',')::bigint[], "
    "string_to_array($7::text, ','), string_to_array($8::text, ',')::int[], "
    "string_to_array($9::text, ',')::bigint[], string_to_array($10::text, ',')::bigint[], "
    "string_to_array($11::text, ',')::bigint[], string_to_array($12::text, E'\\x1e')) "
    "WITH ORDINALITY AS m(k, pool_id, members, cpu, memory, llm, instance, o)), "
    "b AS (SELECT $13::text || '7' || substr(gen_random_uuid()::text, 16, 15) AS p), "
    "r AS (INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm, created_at) "
    "SELECT u.id, m.pool_id, m.members, m.cpu, m.memory, m.llm, $1::timestamptz "
    "FROM m JOIN u ON u.k = m.k), "
    "l AS (INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
    "granted_at, expires_at) SELECT (b.p || to_hex(1048576 + m.o))::uuid, u.id, m.pool_id, "
    "m.instance, u.attempts + 1, 'ACTIVE', $1::timestamptz, $2::timestamptz "
    "FROM m JOIN u ON u.k = m.k CROSS JOIN b), "
    "e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason, detail) "
    "SELECT u.id, $1::timestamptz, 'ADMITTED', 'LEASED', 'leased', "
    "('{\"poolId\": \"' || u.pool_id || '\", \"epoch\": ' || (u.attempts + 1)::text || '}')::jsonb "
    "FROM u ORDER BY u.id "
    "RETURNING task_id, id) "
    "SELECT array_agg(task_id), array_agg(id) FROM e"
)
#: :data:`_LEASE` with the instances as a list (one of them contains the delimiter).
_LEASE_LISTED = _LEASE.replace("string_to_array($12::text, E'\\x1e')", "$12::text[]")


async def tasks_lease(
    conn: Connection,
    *,
    grants: Sequence[Grant],
    now: datetime,
    lease_ttl_seconds: float,
) -> dict[uuid.UUID, int]:
    """Mark the granted (locked, admitted) tasks LEASED with their reservations, one lease
    per pool and their ``leased`` event; return the event id of each task leased.

    The ledger is not touched here: :func:`app.ledger.plans.plan_apply` adds the returned
    tasks' amounts after this. Each lease's fencing epoch is ``attempts + preemptions + 1``:
    recovery raises ``attempts`` and a preemption ``preemptions``, so a re-grant is newer.
    """
    if not grants:
        return {}
    with cpu_phase("commit_build"):
        args = _lease_args(grants)
    task_ids, event_ids = await conn.fetchrow(
        _LEASE if type(args[-1]) is str else _LEASE_LISTED,
        now, now + timedelta(seconds=lease_ttl_seconds), *args, uuid7_prefix(now),
    )
    return dict(zip(task_ids, event_ids, strict=True)) if task_ids is not None else {}


#: A grant's task id (its first field).
_TASK_ID = itemgetter(0)


def _lease_args(grants: Sequence[Grant]) -> tuple[Any, ...]:
    """Return the arguments $3..$12 of :data:`_LEASE` for ``grants``."""
    ordered = sorted(grants, key=_TASK_ID)
    ids: list[uuid.UUID] = []
    texts: list[str] = []
    first: list[str] = []
    m_task, m_pool, m_members, m_cpu, m_memory, m_llm, m_instance = [], [], [], [], [], [], []
    for k, (task_id, text, members, (cpu, memory, llm), _) in enumerate(ordered, 1):
        ids.append(task_id)
        texts.append(text)
        first.append(members[0][0])
        for pool_id, count, instance in members:
            m_task.append(k)
            m_pool.append(pool_id)
            m_members.append(count)
            m_cpu.append(count * cpu)
            m_memory.append(count * memory)
            m_llm.append(count * llm)
            m_instance.append(instance)
    return (
        uuids_joined(ids), texts_joined(texts), ids_joined(first),
        ints_joined(m_task), ids_joined(m_pool), ints_joined(m_members),
        ints_joined(m_cpu), ints_joined(m_memory), ints_joined(m_llm),
        _instances(m_instance),
    )


def _instances(instances: list[str]) -> str | list[str]:
    """Return the member rows' instances joined (:func:`plain_joined`), or the list itself
    when they cannot be."""
    joined = plain_joined(instances)
    return instances if joined is None else joined


# $1 now, $2 ids, $3 pending reasons (JSON text), $4 stages, $5 the leased events' ids.
# The tasks were ADMITTED and locked before this transaction leased them, and held no live
# lease: every live lease and reservation they have was written by it.
# The state is checked as ``(t.state = 'LEASED') IS TRUE`` (the same test), not ``t.state =
# 'LEASED'``: that clause lets the planner read ``ix_tasks_leased_tenant`` (whose predicate it
# is) whole and filter by id, and with statistics from before the leases (a burst, a fresh
# load) it did: 45 ms per conflict at 20,000 leased tasks, growing with them, instead of a
# few ``pk_tasks`` lookups.
# The stages and event ids come as delimited text (``n`` is a NULL stage), not as
# ``smallint[]`` and ``bigint[]``: asyncpg has no built-in codec for those and would look them
# up in the server's catalogue (a query of some 7 ms of CPU) on each connection's first
# conflict.
_UNLEASE = (
    "WITH x AS (SELECT * FROM unnest($2::uuid[], $3::text[], "
    "string_to_array($4::text, ',', 'n')::smallint[]) AS x(id, pending, stage)), "
    "r AS (DELETE FROM reservations WHERE task_id = ANY($2::uuid[])), "
    "l AS (DELETE FROM leases WHERE task_id = ANY($2::uuid[]) AND state = 'ACTIVE'), "
    "e AS (DELETE FROM task_events WHERE task_id = ANY($2::uuid[]) "
    "AND id = ANY(string_to_array($5::text, ',')::bigint[])) "
    "UPDATE tasks t SET state = 'ADMITTED', placement = NULL, leased_at = NULL, "
    "pending_reason = x.pending::jsonb, pending_stage = x.stage, updated_at = $1 "
    "FROM x WHERE t.id = ANY($2::uuid[]) AND t.id = x.id AND (t.state = 'LEASED') IS TRUE"
)


async def tasks_unlease(
    conn: Connection,
    *,
    tasks: Sequence[ClaimedTask],
    events: Mapping[uuid.UUID, int],
    now: datetime,
) -> None:
    """Undo :func:`tasks_lease` of this transaction for ``tasks`` (back to ADMITTED with
    their pending reason, their reservations, leases and ``leased`` events deleted).

    The caller gives the amounts the ledger received for them back (or never added them).
    """
    if not tasks:
        return
    ordered = sorted(tasks, key=lambda t: t.id)
    await conn.execute(
        _UNLEASE, now, [t.id for t in ordered], [t.pending_json for t in ordered],
        ",".join(["n" if t.pending_stage is None else str(t.pending_stage) for t in ordered]),
        ints_joined([events[t.id] for t in ordered if t.id in events]),
    )


# $1 now, $2 ids, $3 pending reasons (JSON text or NULL), $4 parked, $5 wake keys (JSON
# arrays as text), $6 stages, $10 the pending codes their events record (NULL: no pending
# event): the rows to update. $7 ids, $8 reasons, $9 pending reasons: the events.
_UNCLAIM = (
    "WITH x AS (SELECT * FROM unnest($2::uuid[], $3::text[], $4::boolean[], $5::text[], "
    "$6::smallint[], $10::text[]) AS x(id, pending, parked, wake, stage, logged)), "
    "u AS (UPDATE tasks t SET parked = x.parked, "
    "pending_reason = COALESCE(x.pending::jsonb, t.pending_reason), "
    "pending_stage = CASE WHEN x.pending IS NULL THEN t.pending_stage ELSE x.stage END, "
    "logged_code = COALESCE(x.logged, t.logged_code), "
    "logged_at = CASE WHEN x.logged IS NULL THEN t.logged_at ELSE $1 END, "
    "logged_count = t.logged_count + (x.logged IS NOT NULL)::int, "
    "wake = CASE WHEN x.parked THEN "
    "ARRAY(SELECT jsonb_array_elements_text(COALESCE(x.wake, '[]')::jsonb)) END, "
    "updated_at = $1 FROM x WHERE t.id = ANY($2::uuid[]) AND t.id = x.id "
    "AND t.state = 'ADMITTED' RETURNING t.id) "
    "INSERT INTO task_events (task_id, at, from_state, to_state, reason, detail) "
    "SELECT e.id, $1::timestamptz, 'ADMITTED', 'ADMITTED', e.reason, e.pending::jsonb "
    "FROM unnest($7::uuid[], $8::text[], $9::text[]) AS e(id, reason, pending) ORDER BY e.id"
)


def _json(value: Any) -> str | None:
    return orjson.dumps(value).decode() if value is not None else None


async def tasks_unclaim(
    conn: Connection,
    *,
    items: Sequence[Unclaim],
    now: datetime,
) -> set[uuid.UUID]:
    """Hand claimed (locked) tasks back as ADMITTED, parked when they fit nowhere; return
    their ids."""
    if not items:
        return set()
    ordered = sorted(items, key=lambda i: i.task_id)
    rows = [i for i in ordered if i.changes_row]
    events = [i for i in ordered if i.event]
    await conn.execute(
        _UNCLAIM,
        now,
        [i.task_id for i in rows],
        [_json(i.pending_reason) for i in rows],
        [i.parked for i in rows],
        [_json(list(i.wake)) if i.wake is not None else None for i in rows],
        [i.stage for i in rows],
        [i.task_id for i in events],
        [i.reason for i in events],
        [_json(i.pending_reason) for i in events],
        [i.logged_code for i in rows],
    )
    trims: dict[int, list[uuid.UUID]] = {}
    for i in events:
        if i.trim_to is not None:
            trims.setdefault(i.trim_to, []).append(i.task_id)
    for keep, ids in trims.items():
        await task_events_trim(conn, task_ids=ids, keep=keep)
    return {i.task_id for i in ordered}


# A preemptor (or reclaimer) waiting for its victims stays parked: it is unparked when its
# last victim's lease ends (app.ledger.preemption), not by wakeups that cannot help it.
_UNPARK = (
    "UPDATE tasks SET parked = false, updated_at = $2 "
    "WHERE state = 'ADMITTED' AND parked AND shard = ANY($1::int[]) "
    "AND (pending_reason ->> 'code') IS DISTINCT FROM 'preempting' "
    "AND (pending_reason ->> 'code') IS DISTINCT FROM 'reclaiming'"
)


async def tasks_unpark(conn: Connection, *, slots: Collection[int], now: datetime) -> int:
    """Make every parked task of ``slots`` claimable again (the safety sweep); return how many."""
    if not slots:
        return 0
    status = await conn.execute(_UNPARK, sorted(slots), now)
    return int(status.rsplit(" ", 1)[-1])


# $1 keys, $2 now, $3 slots (NULL: any). Rows another writer holds are skipped, never waited
# for: a cancel is ending that task, and another wakeup is unparking it anyway. So this
# statement takes no lock in a way that could deadlock, even inside a pass's commit.
_WAKE = (
    "WITH c AS (SELECT id FROM tasks WHERE state = 'ADMITTED' AND parked "
    "AND wake && $1::text[] AND ($3::int[] IS NULL OR shard = ANY($3::int[])) "
    "ORDER BY id FOR UPDATE SKIP LOCKED) "
    "UPDATE tasks t SET parked = false, updated_at = $2 FROM c WHERE t.id = c.id"
)


async def tasks_wake(
    conn: Connection,
    *,
    keys: Collection[str],
    now: datetime,
    slots: Collection[int] | None = None,
) -> int:
    """Make the parked tasks (of ``slots``, if given) whose wake keys overlap ``keys``
    claimable again; return how many."""
    if not keys or (slots is not None and not slots):
        return 0
    status = await conn.execute(
        _WAKE, sorted(keys), now, None if slots is None else sorted(slots)
    )
    return int(status.rsplit(" ", 1)[-1])
