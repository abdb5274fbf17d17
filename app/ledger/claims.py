"""Claims: a reconciler's expiring ownership of admitted tasks, and how a pass hands them back.

``tasks_claim`` takes up to ``batch`` tasks of the owned slots with ``FOR UPDATE SKIP LOCKED``
(concurrent reconcilers skip each other's rows instead of waiting), first re-taking claims
that expired (their reconciler died), then admitted tasks in the policy's claim order:

* ``fifo`` — admission order;
* ``priority`` — effective priority (priority plus aging) among the highest raw priorities
  and the oldest tasks, so an aged low-priority task is not starved out of the batch;
* ``fair`` — at most ``ceil(batch / tenants present)`` tasks per tenant, so one tenant's deep
  backlog cannot fill the batch; the rest of the batch is then filled in admission order.

``tasks_lease`` and ``tasks_unclaim`` apply a pass's decisions; both touch only tasks still
``CLAIMED`` by the calling owner, so a task whose claim expired (and was re-taken) or which
was cancelled meanwhile is silently left out. Every transition appends a task event.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.config import SHARD_SLOTS

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

    @property
    def spec(self) -> dict[str, Any]:
        """Return the stored spec as a dict."""
        return orjson.loads(self.spec_json)


class _Statement:
    """A claim statement: named-parameter SQL run inside the caller's transaction."""

    def __init__(self, clause: Any) -> None:
        self.clause = clause

    async def fetch(self, conn: AsyncConnection, params: dict[str, Any]) -> list[Any]:
        return list((await conn.execute(self.clause, params)).all())


_RETURNING = (
    "RETURNING t.id, t.tenant_id, t.seq, t.priority, CAST(t.spec AS text), t.admitted_at, "
    "t.attempts"
)

_CLAIM_TAIL = (
    "u AS (UPDATE tasks t SET state = 'CLAIMED', claim_owner = :owner, "
    "claim_expires_at = :expires, updated_at = :now FROM c WHERE t.id = c.id "
    + _RETURNING
    + "), e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason) "
    "SELECT u.id, :now, :from_state, 'CLAIMED', :reason FROM u) "
    "SELECT * FROM u"
)

_CLAIM_EXPIRED = _Statement(text(
    "WITH c AS (SELECT id FROM tasks WHERE state = 'CLAIMED' AND claim_expires_at <= :now "
    "AND shard = ANY(CAST(:slots AS int[])) ORDER BY claim_expires_at LIMIT :limit "
    "FOR UPDATE SKIP LOCKED), "
    + _CLAIM_TAIL
))

_CLAIMABLE = "state = 'ADMITTED' AND NOT parked AND shard = ANY(CAST(:slots AS int[]))"

_CLAIM_FIFO = _Statement(text(
    f"WITH c AS (SELECT id FROM tasks WHERE {_CLAIMABLE} ORDER BY seq LIMIT :limit "
    "FOR UPDATE SKIP LOCKED), "
    + _CLAIM_TAIL
))

_CLAIM_PRIORITY = _Statement(text(
    f"WITH c AS (SELECT id FROM tasks WHERE {_CLAIMABLE} AND id IN ("
    f"SELECT id FROM (SELECT id FROM tasks WHERE {_CLAIMABLE} "
    "ORDER BY priority DESC, seq LIMIT :limit) top "
    f"UNION SELECT id FROM (SELECT id FROM tasks WHERE {_CLAIMABLE} "
    "ORDER BY seq LIMIT :limit) old) "
    "ORDER BY priority + EXTRACT(EPOCH FROM (CAST(:now AS timestamptz) - admitted_at)) "
    "/ :aging DESC, seq LIMIT :limit FOR UPDATE SKIP LOCKED), "
    + _CLAIM_TAIL
))

# Loose index scan over ix_tasks_claim_tenant: one probe per (slot, tenant) in the queue.
_FAIR_TENANTS = _Statement(text(
    "WITH RECURSIVE q AS ("
    "(SELECT shard, tenant_id FROM tasks WHERE state = 'ADMITTED' AND NOT parked "
    "AND shard >= :lo ORDER BY shard, tenant_id LIMIT 1) "
    "UNION ALL "
    "SELECT n.shard, n.tenant_id FROM q CROSS JOIN LATERAL ("
    "SELECT shard, tenant_id FROM tasks WHERE state = 'ADMITTED' AND NOT parked "
    "AND (shard, tenant_id) > (q.shard, q.tenant_id) ORDER BY shard, tenant_id LIMIT 1) n "
    "WHERE q.shard < :hi) "
    "SELECT shard, tenant_id FROM q WHERE shard < :hi AND shard = ANY(CAST(:slots AS int[])) "
    "LIMIT :tenants"
))

_CLAIM_FAIR = _Statement(text(
    "WITH q AS (SELECT * FROM unnest(CAST(:q_shards AS int[]), CAST(:q_tenants AS text[])) "
    "AS q(shard, tenant_id)), "
    "c AS (SELECT x.id FROM q CROSS JOIN LATERAL (SELECT id FROM tasks "
    "WHERE shard = q.shard AND tenant_id = q.tenant_id AND state = 'ADMITTED' AND NOT parked "
    "ORDER BY seq LIMIT :per_tenant FOR UPDATE SKIP LOCKED) x LIMIT :limit), "
    + _CLAIM_TAIL
))


def _claimed(rows: Sequence[Any]) -> list[ClaimedTask]:
    return [ClaimedTask(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]


async def tasks_claim(
    conn: AsyncConnection,
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
    base = {
        "owner": owner,
        "slots": sorted(slots),
        "now": now,
        "expires": now + timedelta(seconds=claim_ttl_seconds),
    }
    claimed = _claimed(
        await _CLAIM_EXPIRED.fetch(
            conn, {**base, "limit": batch, "from_state": "CLAIMED", "reason": "claim_expired"}
        )
    )
    fresh = {**base, "from_state": "ADMITTED", "reason": "claimed"}
    left = batch - len(claimed)
    if left > 0 and policy == "fair":
        # Start at a rotating slot: with more tenants than FAIR_TENANTS_MAX, every tenant
        # still gets its turn at the head of the enumeration.
        start = fair_rotation % SHARD_SLOTS
        tenants = await _FAIR_TENANTS.fetch(
            conn, {"slots": base["slots"], "tenants": FAIR_TENANTS_MAX, "lo": start,
                   "hi": SHARD_SLOTS}
        )
        if start and len(tenants) < FAIR_TENANTS_MAX:
            tenants += await _FAIR_TENANTS.fetch(
                conn, {"slots": base["slots"], "tenants": FAIR_TENANTS_MAX - len(tenants),
                       "lo": 0, "hi": start}
            )
        if tenants:
            per_tenant = math.ceil(left / len(tenants))
            rows = await _CLAIM_FAIR.fetch(
                conn,
                {
                    **fresh,
                    "q_shards": [int(t[0]) for t in tenants],
                    "q_tenants": [t[1] for t in tenants],
                    "per_tenant": per_tenant,
                    "limit": left,
                },
            )
            claimed += _claimed(rows)
            left = batch - len(claimed)
    if left > 0 and policy == "priority":
        rows = await _CLAIM_PRIORITY.fetch(
            conn, {**fresh, "limit": left, "aging": float(aging_seconds)}
        )
        claimed += _claimed(rows)
        left = batch - len(claimed)
    if left > 0:
        claimed += _claimed(await _CLAIM_FIFO.fetch(conn, {**fresh, "limit": left}))
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


_LEASE = text(
    "WITH g AS (SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:placements AS text[]), "
    "CAST(:pools AS text[])) AS g(id, placement, pool_id)), "
    "u AS (UPDATE tasks t SET state = 'LEASED', placement = CAST(g.placement AS jsonb), "
    "leased_at = :now, claim_owner = NULL, claim_expires_at = NULL, pending_reason = NULL, "
    "parked = false, updated_at = :now FROM g "
    "WHERE t.id = g.id AND t.state = 'CLAIMED' AND t.claim_owner = :owner "
    "RETURNING t.id, t.attempts, g.pool_id), "
    "m AS (SELECT * FROM unnest(CAST(:m_task AS uuid[]), CAST(:m_pool AS text[]), "
    "CAST(:m_members AS int[]), CAST(:m_cpu AS bigint[]), CAST(:m_memory AS bigint[]), "
    "CAST(:m_llm AS bigint[]), CAST(:m_instance AS text[])) "
    "AS m(task_id, pool_id, members, cpu, memory, llm, instance)), "
    "r AS (INSERT INTO reservations (task_id, pool_id, members, cpu, memory, llm, created_at) "
    "SELECT m.task_id, m.pool_id, m.members, m.cpu, m.memory, m.llm, :now "
    "FROM m JOIN u ON u.id = m.task_id), "
    "l AS (INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
    "granted_at, expires_at) SELECT gen_random_uuid(), m.task_id, m.pool_id, m.instance, "
    "u.attempts + 1, 'ACTIVE', :now, :expires FROM m JOIN u ON u.id = m.task_id), "
    "e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason, detail) "
    "SELECT u.id, :now, 'CLAIMED', 'LEASED', 'leased', "
    "jsonb_build_object('poolId', u.pool_id, 'epoch', u.attempts + 1) FROM u) "
    "SELECT id FROM u"
)


async def tasks_lease(
    conn: AsyncConnection,
    *,
    owner: str,
    grants: Sequence[Grant],
    now: datetime,
    lease_ttl_seconds: float,
) -> set[uuid.UUID]:
    """Mark the granted tasks LEASED with reservations rows and leases; return those applied.

    The ledger is not touched here: the caller adds the returned tasks' amounts with
    :func:`app.ledger.reservations.ledger_reserve_many` last, before COMMIT. Each lease's
    fencing epoch is ``attempts + 1``: recovery raises ``attempts``, so a re-grant is newer.
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
    rows = await conn.execute(
        _LEASE,
        {
            "owner": owner,
            "now": now,
            "expires": now + timedelta(seconds=lease_ttl_seconds),
            "ids": [g.task_id for g in ordered],
            "placements": [orjson.dumps(g.placement).decode() for g in ordered],
            "pools": [g.members[0][0] for g in ordered],
            "m_task": m_task,
            "m_pool": m_pool,
            "m_members": m_members,
            "m_cpu": m_cpu,
            "m_memory": m_memory,
            "m_llm": m_llm,
            "m_instance": m_instance,
        },
    )
    return {r[0] for r in rows}


@dataclass(frozen=True, slots=True)
class Unclaim:
    """A claimed task handed back to the queue: parked with a pending reason, or not."""

    task_id: uuid.UUID
    reason: str
    pending_reason: dict[str, Any] | None = None
    parked: bool = False


_UNCLAIM = text(
    "WITH x AS (SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:pending AS text[]), "
    "CAST(:parked AS boolean[]), CAST(:reasons AS text[])) AS x(id, pending, parked, reason)), "
    "u AS (UPDATE tasks t SET state = 'ADMITTED', claim_owner = NULL, claim_expires_at = NULL, "
    "parked = x.parked, pending_reason = COALESCE(CAST(x.pending AS jsonb), t.pending_reason), "
    "updated_at = :now FROM x WHERE t.id = x.id AND t.state = 'CLAIMED' "
    "AND t.claim_owner = :owner RETURNING t.id, x.reason, x.pending), "
    "e AS (INSERT INTO task_events (task_id, at, from_state, to_state, reason, detail) "
    "SELECT u.id, :now, 'CLAIMED', 'ADMITTED', u.reason, CAST(u.pending AS jsonb) FROM u) "
    "SELECT id FROM u"
)


async def tasks_unclaim(
    conn: AsyncConnection, *, owner: str, items: Sequence[Unclaim], now: datetime
) -> set[uuid.UUID]:
    """Return claimed tasks to ADMITTED (parked when they fit nowhere); return those applied."""
    if not items:
        return set()
    ordered = sorted(items, key=lambda i: i.task_id)
    rows = await conn.execute(
        _UNCLAIM,
        {
            "owner": owner,
            "now": now,
            "ids": [i.task_id for i in ordered],
            "pending": [
                orjson.dumps(i.pending_reason).decode() if i.pending_reason is not None else None
                for i in ordered
            ],
            "parked": [i.parked for i in ordered],
            "reasons": [i.reason for i in ordered],
        },
    )
    return {r[0] for r in rows}


_UNPARK = text(
    "UPDATE tasks SET parked = false, updated_at = :now "
    "WHERE state = 'ADMITTED' AND parked AND shard = ANY(CAST(:slots AS int[]))"
)


async def tasks_unpark(conn: AsyncConnection, *, slots: Collection[int], now: datetime) -> int:
    """Make the parked tasks of ``slots`` claimable again; return how many."""
    if not slots:
        return 0
    result = await conn.execute(_UNPARK, {"slots": sorted(slots), "now": now})
    return result.rowcount
