"""Claims: a reconciler's expiring ownership of admitted tasks, and how a pass hands them back.

``tasks_claim`` takes up to ``batch`` tasks of the owned slots with ``FOR UPDATE SKIP LOCKED``
(concurrent reconcilers skip each other's rows instead of waiting), first re-taking claims
that expired (their reconciler died), then admitted tasks in the policy's claim order:

* ``fifo`` — admission order;
* ``priority`` — effective priority (priority plus aging) among the highest raw priorities
  and the oldest tasks, so an aged low-priority task is not starved out of the batch;
* ``fair`` — at most ``ceil(batch / tenants present)`` tasks per tenant, so one tenant's deep
  backlog cannot fill the batch; the rest of the batch is then filled in admission order.

``tasks_lease`` and ``tasks_unclaim`` apply a pass's decisions (through
:func:`app.ledger.plans.plan_apply`); both touch only tasks still ``CLAIMED`` by the calling
owner, so a task whose claim expired (and was re-taken) or which was cancelled meanwhile is
silently left out.

**Events grow with changes, not with time** (SPEC §5). A task that already carries a pending
reason (it was parked, then woken) is claimed *silently*: no ``claimed`` event. If the pass
finds it pending for the same reason code, it is parked again with no event at all (its
pending reason, wake keys and stage are refreshed in place). If the outcome differs (leased,
another reason, a lost race), the deferred ``claimed`` event is written first, at the claim's
time, then the outcome's: the history reads as it always did, minus the repetitions.

``tasks_wake`` and ``tasks_unpark`` make parked tasks claimable again: the first only those
whose wake keys (:mod:`app.scheduling.parking`) overlap a wakeup's, the second all of a set
of slots (the safety sweep).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from app.config import SHARD_SLOTS
from app.db import Connection

#: Most tenants the fair claim looks at in one pass.
FAIR_TENANTS_MAX = 512


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task claimed by this pass, with what scheduling it needs."""

    id: uuid.UUID
    tenant_id: str
    seq: int
    priority: int
    #: The stored spec as JSON text (equal texts compile to equal specs: a cache key).
    spec_json: str
    admitted_at: datetime
    attempts: int
    #: The stored pending code, when the task was claimed silently (a re-examination of a
    #: woken task: its ``claimed`` event is written only if the outcome changes).
    pending_code: str | None = None

    @property
    def spec(self) -> dict[str, Any]:
        """Return the stored spec as a dict."""
        return orjson.loads(self.spec_json)


# Parameters shared by every claim statement: $1 owner, $2 claim expiry, $3 now,
# $4 the event's from_state, $5 the event's reason. A fresh claim of a task that carries a
# pending reason is silent (its code is returned); a claim taken over from a dead pass is not.
_CLAIM_TAIL = (
    "u AS (UPDATE tasks t SET state = 'CLAIMED', claim_owner = $1, "
    "claim_expires_at = $2, updated_at = $3 FROM c WHERE t.id = c.id "
    "RETURNING t.id, t.tenant_id, t.seq, t.priority, t.spec::text, t.admitted_at, t.attempts, "
    "CASE WHEN $5::text = 'claimed' THEN t.pending_reason ->> 'code' END AS silent), "
    "e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason) "
    "SELECT u.id, $3::timestamptz, $4::text, 'CLAIMED', $5::text FROM u "
    "WHERE u.silent IS NULL) "
    "SELECT * FROM u"
)

# $6 slots, $7 limit.
_CLAIM_EXPIRED = (
    "WITH c AS (SELECT id FROM tasks WHERE state = 'CLAIMED' AND claim_expires_at <= $3 "
    "AND shard = ANY($6::int[]) ORDER BY claim_expires_at LIMIT $7 "
    "FOR UPDATE SKIP LOCKED), "
    + _CLAIM_TAIL
)

_CLAIMABLE = "state = 'ADMITTED' AND NOT parked AND shard = ANY($6::int[])"

# $6 slots, $7 limit.
_CLAIM_FIFO = (
    f"WITH c AS (SELECT id FROM tasks WHERE {_CLAIMABLE} ORDER BY seq LIMIT $7 "
    "FOR UPDATE SKIP LOCKED), "
    + _CLAIM_TAIL
)

# $6 slots, $7 limit, $8 aging seconds.
_CLAIM_PRIORITY = (
    f"WITH c AS (SELECT id FROM tasks WHERE {_CLAIMABLE} AND id IN ("
    f"SELECT id FROM (SELECT id FROM tasks WHERE {_CLAIMABLE} "
    "ORDER BY priority DESC, seq LIMIT $7) top "
    f"UNION SELECT id FROM (SELECT id FROM tasks WHERE {_CLAIMABLE} "
    "ORDER BY seq LIMIT $7) old) "
    "ORDER BY priority + EXTRACT(EPOCH FROM ($3::timestamptz - admitted_at)) "
    "/ $8::float8 DESC, seq LIMIT $7 FOR UPDATE SKIP LOCKED), "
    + _CLAIM_TAIL
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

# $6 shards, $7 tenants, $8 per tenant, $9 limit.
_CLAIM_FAIR = (
    "WITH q AS (SELECT * FROM unnest($6::int[], $7::text[]) AS q(shard, tenant_id)), "
    "c AS (SELECT x.id FROM q CROSS JOIN LATERAL (SELECT id FROM tasks "
    "WHERE shard = q.shard AND tenant_id = q.tenant_id AND state = 'ADMITTED' AND NOT parked "
    "ORDER BY seq LIMIT $8 FOR UPDATE SKIP LOCKED) x LIMIT $9), "
    + _CLAIM_TAIL
)


def _claimed(rows: Sequence[Any]) -> list[ClaimedTask]:
    return [ClaimedTask(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in rows]


async def tasks_claim(
    conn: Connection,
    *,
    owner: str,
    slots: Collection[int],
    batch: int,
    now: datetime,
    claim_ttl_seconds: float,
    policy: str = "fifo",
    aging_seconds: float = 60.0,
    fair_rotation: int = 0,
) -> list[ClaimedTask]:
    """Claim up to ``batch`` tasks of ``slots`` for ``owner`` until ``now + claim_ttl``.

    ``fair_rotation`` picks the slot where the fair claim starts listing tenants (pass a
    counter: the start moves every pass).
    """
    if not slots or batch <= 0:
        return []
    owned = sorted(slots)
    expires = now + timedelta(seconds=claim_ttl_seconds)
    claimed = _claimed(await conn.fetch(
        _CLAIM_EXPIRED, owner, expires, now, "CLAIMED", "claim_expired", owned, batch
    ))
    fresh = (owner, expires, now, "ADMITTED", "claimed")
    left = batch - len(claimed)
    if left > 0 and policy == "fair":
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
            rows = await conn.fetch(
                _CLAIM_FAIR, *fresh, [int(t[0]) for t in tenants], [t[1] for t in tenants],
                per_tenant, left,
            )
            claimed += _claimed(rows)
            left = batch - len(claimed)
    if left > 0 and policy == "priority":
        rows = await conn.fetch(_CLAIM_PRIORITY, *fresh, owned, left, float(aging_seconds))
        claimed += _claimed(rows)
        left = batch - len(claimed)
    if left > 0:
        claimed += _claimed(await conn.fetch(_CLAIM_FIFO, *fresh, owned, left))
    return claimed


@dataclass(frozen=True, slots=True)
class Grant:
    """A decided placement to apply: the task, its placement JSON and its members."""

    task_id: uuid.UUID
    placement: dict[str, Any]
    #: (pool id, member count, runtime instance id) per pool the task uses.
    members: tuple[tuple[str, int, str], ...]
    #: What one member requests: (cpu, memory, llm).
    requests: tuple[int, int, int]
    #: Claimed silently: the deferred ``claimed`` event is written with the lease's.
    silent: bool = False
    #: Wake keys this placement carries once leased (``placed:<tenant>`` for a labelled
    #: task: parked tasks of its tenant waiting for an affinity match).
    wakes: tuple[str, ...] = ()


# $1 owner, $2 now, $3 expires, $4 ids, $5 placements (JSON text), $6 first pools,
# $7..$13 the member rows.
_LEASE = (
    "WITH g AS (SELECT * FROM unnest($4::uuid[], $5::text[], $6::text[]) "
    "AS g(id, placement, pool_id)), "
    "u AS (UPDATE tasks t SET state = 'LEASED', placement = g.placement::jsonb, "
    "leased_at = $2, claim_owner = NULL, claim_expires_at = NULL, pending_reason = NULL, "
    "parked = false, wake = NULL, pending_stage = NULL, updated_at = $2 FROM g "
    "WHERE t.id = g.id AND t.state = 'CLAIMED' AND t.claim_owner = $1 "
    "RETURNING t.id, t.attempts + t.preemptions AS attempts, g.pool_id), "
    "m AS (SELECT * FROM unnest($7::uuid[], $8::text[], $9::int[], $10::bigint[], "
    "$11::bigint[], $12::bigint[], $13::text[]) "
    "AS m(task_id, pool_id, members, cpu, memory, llm, instance)), "
    "r AS (INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm, created_at) "
    "SELECT m.task_id, m.pool_id, m.members, m.cpu, m.memory, m.llm, $2::timestamptz "
    "FROM m JOIN u ON u.id = m.task_id), "
    "l AS (INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
    "granted_at, expires_at) SELECT gen_random_uuid(), m.task_id, m.pool_id, m.instance, "
    "u.attempts + 1, 'ACTIVE', $2::timestamptz, $3::timestamptz "
    "FROM m JOIN u ON u.id = m.task_id), "
    "e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason, detail) "
    "SELECT id, at, f, s, r, d FROM ("
    "SELECT u.id, $15::timestamptz AS at, 'ADMITTED' AS f, 'CLAIMED' AS s, 'claimed' AS r, "
    "NULL::jsonb AS d, 0 AS o FROM u WHERE u.id = ANY($14::uuid[]) "
    "UNION ALL SELECT u.id, $2::timestamptz, 'CLAIMED', 'LEASED', 'leased', "
    "jsonb_build_object('poolId', u.pool_id, 'epoch', u.attempts + 1), 1 FROM u"
    ") v ORDER BY id, o) "
    "SELECT id FROM u"
)


async def tasks_lease(
    conn: Connection,
    *,
    owner: str,
    grants: Sequence[Grant],
    now: datetime,
    lease_ttl_seconds: float,
    claimed_at: datetime | None = None,
) -> set[uuid.UUID]:
    """Mark the granted tasks LEASED with reservations rows and leases; return those applied.

    A silently claimed grant gets its deferred ``claimed`` event at ``claimed_at`` (default
    ``now``) before its ``leased`` event.

    The ledger is not touched here: :func:`app.ledger.plans.plan_apply` adds the returned
    tasks' amounts last, before COMMIT. Each lease's fencing epoch is
    ``attempts + preemptions + 1``: recovery raises ``attempts`` and a preemption
    ``preemptions``, so a re-grant is newer.
    """
    if not grants:
        return set()
    ordered = sorted(grants, key=lambda g: g.task_id)
    m_task, m_pool, m_members, m_cpu, m_memory, m_llm, m_instance = [], [], [], [], [], [], []
    for g in ordered:
        for pool_id, count, instance in g.members:
            m_task.append(g.task_id)
            m_pool.append(pool_id)
            m_members.append(count)
            m_cpu.append(count * g.requests[0])
            m_memory.append(count * g.requests[1])
            m_llm.append(count * g.requests[2])
            m_instance.append(instance)
    rows = await conn.fetch(
        _LEASE,
        owner,
        now,
        now + timedelta(seconds=lease_ttl_seconds),
        [g.task_id for g in ordered],
        [orjson.dumps(g.placement).decode() for g in ordered],
        [g.members[0][0] for g in ordered],
        m_task, m_pool, m_members, m_cpu, m_memory, m_llm, m_instance,
        [g.task_id for g in ordered if g.silent],
        claimed_at or now,
    )
    return {r[0] for r in rows}


@dataclass(frozen=True, slots=True)
class Unclaim:
    """A claimed task handed back to the queue: parked with a pending reason, or not.

    ``event`` False hands it back without an event (a re-examination that found the same
    reason); ``silent`` marks a task claimed silently, whose deferred ``claimed`` event is
    written before the hand-back's when there is one.
    """

    task_id: uuid.UUID
    reason: str
    pending_reason: dict[str, Any] | None = None
    parked: bool = False
    #: Wake keys of a parked task (None: woken only by the safety sweep).
    wake: tuple[str, ...] | None = None
    #: Stage of the pending reason's closest miss (with ``pending_reason``).
    stage: int | None = None
    event: bool = True
    silent: bool = False


# $1 owner, $2 now, $3 ids, $4 pending reasons (JSON text or NULL), $5 parked, $6 reasons,
# $7 wake keys (JSON arrays as text), $8 stages, $9 event, $10 silent, $11 claim time.
_UNCLAIM = (
    "WITH x AS (SELECT * FROM unnest($3::uuid[], $4::text[], $5::boolean[], $6::text[], "
    "$7::text[], $8::smallint[], $9::boolean[], $10::boolean[]) "
    "AS x(id, pending, parked, reason, wake, stage, event, silent)), "
    "u AS (UPDATE tasks t SET state = 'ADMITTED', claim_owner = NULL, claim_expires_at = NULL, "
    "parked = x.parked, pending_reason = COALESCE(x.pending::jsonb, t.pending_reason), "
    "pending_stage = CASE WHEN x.pending IS NULL THEN t.pending_stage ELSE x.stage END, "
    "wake = CASE WHEN x.parked THEN "
    "ARRAY(SELECT jsonb_array_elements_text(COALESCE(x.wake, '[]')::jsonb)) END, "
    "updated_at = $2 FROM x WHERE t.id = x.id AND t.state = 'CLAIMED' "
    "AND t.claim_owner = $1 RETURNING t.id, x.reason, x.pending, x.event, x.silent), "
    "e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason, detail) "
    "SELECT id, at, f, s, r, d FROM ("
    "SELECT u.id, $11::timestamptz AS at, 'ADMITTED' AS f, 'CLAIMED' AS s, 'claimed' AS r, "
    "NULL::jsonb AS d, 0 AS o FROM u WHERE u.event AND u.silent "
    "UNION ALL SELECT u.id, $2::timestamptz, 'CLAIMED', 'ADMITTED', u.reason, "
    "u.pending::jsonb, 1 FROM u WHERE u.event"
    ") v ORDER BY id, o) "
    "SELECT id FROM u"
)


async def tasks_unclaim(
    conn: Connection,
    *,
    owner: str,
    items: Sequence[Unclaim],
    now: datetime,
    claimed_at: datetime | None = None,
) -> set[uuid.UUID]:
    """Return claimed tasks to ADMITTED (parked when they fit nowhere); return those applied.

    Deferred ``claimed`` events of silent claims carry ``claimed_at`` (default ``now``).
    """
    if not items:
        return set()
    ordered = sorted(items, key=lambda i: i.task_id)
    rows = await conn.fetch(
        _UNCLAIM,
        owner,
        now,
        [i.task_id for i in ordered],
        [
            orjson.dumps(i.pending_reason).decode() if i.pending_reason is not None else None
            for i in ordered
        ],
        [i.parked for i in ordered],
        [i.reason for i in ordered],
        [orjson.dumps(list(i.wake)).decode() if i.wake is not None else None for i in ordered],
        [i.stage for i in ordered],
        [i.event for i in ordered],
        [i.silent for i in ordered],
        claimed_at or now,
    )
    return {r[0] for r in rows}


# A preemptor waiting for its victims stays parked: it is unparked when its last victim's
# lease ends (app.ledger.preemption), not by wakeups that cannot help it.
_UNPARK = (
    "UPDATE tasks SET parked = false, updated_at = $2 "
    "WHERE state = 'ADMITTED' AND parked AND shard = ANY($1::int[]) "
    "AND pending_reason ->> 'code' IS DISTINCT FROM 'preempting'"
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
