"""A small Berth world driven through the ledger functions the API uses, with a real
reconciler passing over it, and the checks of its holds after every pass.

Used by :mod:`tests.reconciler.test_holds_over_passes`: three pools of one runtime class,
three tenants in two cohorts under one root, every change made by the function its API
endpoint calls (submit, complete, cancel, heartbeat, tenant and cohort PUT, cordon,
capacity PUT), the leader's recovery round and the safety sweep before each pass.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app.config import SHARD_SLOTS
from app.db import Connection, Database
from app.ledger.claims import tasks_unpark
from app.ledger.cohorts import cohort_put
from app.ledger.invariants import ledger_check
from app.ledger.leases import lease_complete, runtime_heartbeat, task_cancel
from app.ledger.pools import pool_capacity_put, pool_status_set
from app.ledger.quotas import quota_rows_read, quota_tree_read
from app.ledger.reclaim import displacers_read
from app.ledger.tasks import task_submit
from app.ledger.tenants import Quota, tenant_put
from app.reconciler import Reconciler, ReconcilerConfig
from app.scheduling.plugins.quota import QuotaBook, cohort_rows_drawn
from app.scheduling.records import NOMINATED, PREEMPTING, RECLAIMING
from app.scheduling.spec import TaskSpec
from tests.factories import NOW, ledger_violations, pool_add

RC = "standard"
POOLS = ("p0", "p1", "p2")
TENANTS = ("a", "b", "c")
COHORTS = ("c1", "c2")
CAPACITY = 4000
GRACE = 30.0
NOMINATION = 60.0
LEASE_TTL = 90.0
#: The longest step between two passes: a victim past its revokeBy by more than this is
#: overdue by more than one pass.
STEP_MAX = 100.0
ALL = frozenset(range(SHARD_SLOTS))
DISPLACING = frozenset({PREEMPTING, RECLAIMING})


def cpu_quota(nominal: int, borrowing: int | None = None) -> dict[str, dict[str, Quota]]:
    """Return a quota of ``nominal`` cpu (and ``borrowing`` above it) in the class."""
    return {RC: {"cpuMillis": Quota(nominal, borrowing, None)}}


@dataclass
class Holder:
    """A task holding capacity after a pass, as the database says."""

    task_id: uuid.UUID
    tenant: str
    code: str | None
    need: tuple[int, int, int]
    held: dict[str, int]
    #: Pools its nominations name, with the cpu they need there (nominees).
    nominated: dict[str, int] = field(default_factory=dict)
    #: Its victims still revoking: (pool, cpu reserved, revoke_by, the victim's tenant).
    victims: list[tuple[str, int, datetime, str]] = field(default_factory=list)


class World:
    """The world of one example: its clock, its reconciler and what it submitted."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.now = NOW
        self.passes = 0
        self.tasks: list[uuid.UUID] = []
        self.silent: set[str] = set()
        self.rec = Reconciler(db, ReconcilerConfig(
            nomination_seconds=NOMINATION, preemption_grace_seconds=GRACE,
            reclaim_min_runtime_seconds=0, lease_ttl_seconds=LEASE_TTL, batch_size=200,
            pass_records_seconds=0,
        ), owner_id="holds", slots=ALL)
        #: Each holder after the previous pass: its total held cpu.
        self.before: dict[uuid.UUID, int] = {}

    async def build(self) -> None:
        """Pools, cohorts and tenants of the world, every tenant within a nominal."""
        async with self.db.transaction() as conn:
            for i, pool in enumerate(POOLS):
                await pool_add(conn, pool, tenants=TENANTS, capacity=(CAPACITY, 65536, 0),
                               labels={"zone": f"z{i % 2}"})
            await cohort_put(conn, cohort_id="root", parent=None, fair_weight=1.0,
                             quotas=cpu_quota(0), now=self.now)
            for cohort in COHORTS:
                await cohort_put(conn, cohort_id=cohort, parent="root", fair_weight=1.0,
                                 quotas=cpu_quota(0), now=self.now)
            for tenant, cohort, nominal in (("a", "c1", 4000), ("b", "c1", 4000),
                                            ("c", "c2", 4000)):
                await tenant_put(conn, tenant_id=tenant, cohort=cohort, fair_weight=1.0,
                                 quotas=cpu_quota(nominal), now=self.now)
        # A busy world to start from: a borrows 2000m of b's nominal, c uses most of its own.
        await self.submit("a", 1000, 0, False, None, 6)
        await self.submit("c", 1000, 0, False, None, 3)
        await self.tick(1.0)

    # --- changes of the world ------------------------------------------------------------

    async def submit(self, tenant: str, cpu: int, priority: int, preempt: bool,
                     zone: str | None, count: int) -> None:
        """Submit ``count`` tasks as POST /v1/tasks stores them."""
        body: dict[str, Any] = {"runtimeClass": RC, "requests": {"cpuMillis": cpu},
                                "priority": priority,
                                "preemption": "lowerPriority" if preempt else "never"}
        if zone is not None:
            body["constraints"] = {"poolSelector": {"zone": zone}}
        spec = TaskSpec.model_validate(body).model_dump(mode="json", by_alias=True)
        async with self.db.connection() as conn:
            for _ in range(count):
                row = await task_submit(conn, tenant_id=tenant, spec=spec,
                                        idempotency_key=None, request_hash=None, now=self.now)
                self.tasks.append(row.id)

    async def end(self, pick: int, outcome: str) -> None:
        """The runtime completes (or gives back) one live lease, the ``pick``-th (-1: the
        first revoking one, else the first on a pool a task holds on)."""
        held = await self.holder() if pick < 0 else None
        async with self.db.connection() as conn:
            leases = await conn.fetch(
                "SELECT l.id, l.epoch FROM leases l JOIN tasks t ON t.id = l.task_id "
                "WHERE l.state IN ('ACTIVE', 'REVOKING') ORDER BY "
                "(l.state = 'REVOKING') DESC, (l.pool_id = $1) DESC, t.seq, l.pool_id",
                held[2] if held is not None else "")
            if pick < 0:
                pick = 0
        if not leases:
            return
        lease_id, epoch = leases[pick % len(leases)]
        async with self.db.transaction() as conn:
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome=outcome,
                                 message=None, now=self.now)

    async def holder(self) -> tuple[uuid.UUID, str, str] | None:
        """Return the first task holding capacity (task, tenant, a pool it holds on), if
        any: changes aimed at it find what a generated world rarely hits by chance."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(
                "SELECT t.id, t.tenant_id, r.pool_id FROM reservations r "
                "JOIN tasks t ON t.id = r.task_id WHERE r.hold ORDER BY t.seq, r.pool_id "
                "LIMIT 1")
        return None if row is None else (row[0], row[1], row[2])

    async def cancel(self, pick: int) -> None:
        """The tenant cancels one of its unfinished tasks, the ``pick``-th (-1: the first
        holder)."""
        async with self.db.connection() as conn:
            rows = await conn.fetch("SELECT id, tenant_id FROM tasks WHERE state IN "
                                    "('ADMITTED', 'LEASED') ORDER BY seq")
        held = await self.holder() if pick < 0 else None
        if held is not None:
            rows = [(held[0], held[1])]
        if not rows:
            return
        task_id, tenant = rows[pick % len(rows)]
        async with self.db.transaction() as conn:
            await task_cancel(conn, task_id=task_id, tenant_id=tenant, now=self.now)

    async def quota(self, tenant: str, cohort: str, nominal: int,
                    borrowing: int | None) -> bool:
        """The admin PUTs a tenant's cohort and quota; False when refused (below usage)."""
        try:
            async with self.db.transaction() as conn:
                await tenant_put(conn, tenant_id=tenant, cohort=cohort, fair_weight=1.0,
                                 quotas=cpu_quota(nominal, borrowing), now=self.now)
        except Exception as exc:  # QuotaBelowUsage: a 409, nothing changed
            if type(exc).__name__ != "QuotaBelowUsage":
                raise
            return False
        return True

    async def cohort_quota(self, cohort: str, nominal: int) -> None:
        """The admin PUTs a cohort's own quota."""
        async with self.db.transaction() as conn:
            await cohort_put(conn, cohort_id=cohort, parent="root", fair_weight=1.0,
                             quotas=cpu_quota(nominal), now=self.now)

    async def status(self, pool: str, status: str) -> None:
        """The operator cordons or activates a pool."""
        async with self.db.transaction() as conn:
            await pool_status_set(conn, pool_id=pool, status=status, reason=None,
                                  drain_deadline=None, now=self.now)

    async def capacity(self, pool: str, cpu: int) -> bool:
        """The operator PUTs a pool's capacity; False when refused (below reserved)."""
        try:
            async with self.db.transaction() as conn:
                await pool_capacity_put(conn, pool_id=pool, totals=(cpu, 65536, 0),
                                        now=self.now)
        except Exception as exc:  # CapacityBelowReserved: a 409, nothing changed
            if type(exc).__name__ != "CapacityBelowReserved":
                raise
            return False
        return True

    # --- a pass ----------------------------------------------------------------------------

    async def tick(self, seconds: float) -> None:
        """Time passes; runtimes not silent heartbeat; the leader's recovery round and the
        safety sweep run; then one pass, and its checks."""
        assert seconds <= STEP_MAX
        self.now += timedelta(seconds=seconds)
        async with self.db.transaction() as conn:
            for pool in POOLS:
                if pool not in self.silent:
                    await runtime_heartbeat(conn, instance_id=f"rt-{pool}", now=self.now,
                                            lease_ttl_seconds=LEASE_TTL)
        self.silent.clear()
        await self.rec.recover_once(now=self.now)
        async with self.db.connection() as conn:
            await tasks_unpark(conn, slots=ALL, now=self.now)
        await self.rec.run_once(now=self.now)
        self.passes += 1
        await self.check()

    async def check(self) -> None:
        """Check the ledger and every hold after a pass (see the test module's doc)."""
        violations = await ledger_violations(self.db)
        assert not violations, f"after pass {self.passes}: {violations}"
        async with self.db.connection() as conn:
            broken = {k: v for k, v in (await ledger_check(conn)).items() if v}
            assert not broken, f"after pass {self.passes}: {broken}"
            holders = await holders_read(conn)
            book = await _book_read(conn)
        for h in holders.values():
            orphaned(h, book)
        for h in holders.values():
            was = self.before.get(h.task_id)
            if was is not None:
                stuck(h, was, book, now=self.now)
        self.before = {h.task_id: sum(h.held.values()) for h in holders.values()}


# --- reads of the checks -----------------------------------------------------------------

_HOLDS = (
    "SELECT r.task_id, r.pool_id, r.cpu, t.state, t.tenant_id, t.pending_reason ->> 'code', "
    "coalesce((t.spec -> 'requests' ->> 'cpuMillis')::bigint, 0) "
    "* coalesce((t.spec -> 'gang' ->> 'members')::int, 1) "
    "FROM reservations r JOIN tasks t ON t.id = r.task_id WHERE r.hold ORDER BY 1, 2"
)
_VICTIMS = (
    "SELECT l.preempted_by, l.pool_id, coalesce(r.cpu, 0), l.revoke_by, t.tenant_id "
    "FROM leases l JOIN tasks t ON t.id = l.task_id "
    "LEFT JOIN reservations r ON r.task_id = l.task_id AND r.pool_id = l.pool_id "
    "WHERE l.state = 'REVOKING' AND l.preempted_by = ANY($1::uuid[])"
)
_NOMINATED = "SELECT task_id, pool_id, cpu FROM nominations WHERE task_id = ANY($1::uuid[])"


async def holders_read(conn: Connection) -> dict[uuid.UUID, Holder]:
    """Return every task holding capacity (hold rows), with its nominations and victims."""
    holders: dict[uuid.UUID, Holder] = {}
    for task_id, pool, cpu, state, tenant, code, need in await conn.fetch(_HOLDS):
        assert state == "ADMITTED", f"hold of a {state} task {task_id}"
        h = holders.setdefault(task_id, Holder(task_id, tenant, code, (int(need), 0, 0), {}))
        h.held[pool] = int(cpu)
    ids = list(holders)
    for preemptor, pool, cpu, revoke_by, tenant in await conn.fetch(_VICTIMS, ids):
        holders[preemptor].victims.append((pool, int(cpu), revoke_by, tenant))
    for task_id, pool, cpu in await conn.fetch(_NOMINATED, ids):
        holders[task_id].nominated[pool] = int(cpu)
    return holders


@dataclass(frozen=True)
class Book:
    """The quota book a pass plans with, as the ledger holds it now, and the pools: the rows
    as read, the needs of the waiting preemptors and reclaimers and what the leases being
    revoked give back (cpu, per tenant)."""

    rows: list
    tree: list
    cohorts: dict[str, str]
    waiting: dict[uuid.UUID, tuple[str, str, tuple[int, int, int]]]
    #: Per pool: total cpu, cpu reserved by live leases, the pool's status.
    pools: dict[str, tuple[int, int, str]]
    #: Per tenant, the cpu of its leases being revoked.
    revoking: dict[str, int]

    def needs(self) -> dict[str, int]:
        """Return per tenant the cpu its waiting preemptors and reclaimers need."""
        out: dict[str, int] = {}
        for tenant, _, need in self.waiting.values():
            out[tenant] = out.get(tenant, 0) + need[0]
        return out

    def used(self, tenant: str, *, stopped: bool) -> int:
        """Return what the book counts as the tenant's cpu usage beyond its leases: every
        waiting displacement placed and, when ``stopped``, every victim stopped (else never
        less than its leases now)."""
        more = self.needs().get(tenant, 0) - self.revoking.get(tenant, 0)
        return more if stopped else max(more, 0)

    def refuse(self, h: Holder) -> object:
        """Return why the holder's quota refuses it now, else None: its own counted need
        left out, and for a preemptor or reclaimer with every victim stopped (each
        displacement's need counted, each victim's usage given back)."""
        own = self.waiting.get(h.task_id)
        stopped = h.code in DISPLACING
        rows = []
        for r in self.rows:
            used = r.used
            if r.resource == "cpuMillis":
                used += self.used(r.tenant_id, stopped=stopped)
                if own is not None and r.tenant_id == own[0]:
                    used -= own[2][0]
            rows.append(dataclasses.replace(r, used=used))
        tree = cohort_rows_drawn(self.tree, self.rows, rows)
        return QuotaBook(rows, self.cohorts, tree).refuse(h.tenant, RC, h.need)


_POOLS = (
    "SELECT p.id, l.cpu_total, p.status, (SELECT coalesce(sum(r.cpu), 0) FROM reservations r "
    "WHERE r.pool_id = p.id AND NOT r.hold) FROM pools p JOIN ledgers l ON l.pool_id = p.id"
)


_REVOKING = (
    "SELECT t.tenant_id, sum(r.cpu) FROM leases l JOIN tasks t ON t.id = l.task_id "
    "JOIN reservations r ON r.task_id = l.task_id AND r.pool_id = l.pool_id AND NOT r.hold "
    "WHERE l.state = 'REVOKING' AND l.revoke_by IS NOT NULL GROUP BY 1"
)


async def _book_read(conn: Connection) -> Book:
    rows, cohorts = await quota_rows_read(conn, runtime_classes=[RC], tenant_ids=TENANTS)
    tree, _, of = await quota_tree_read(conn, runtime_classes=[RC], tenant_ids=TENANTS)
    waiting = await displacers_read(conn)
    pools = {r[0]: (int(r[1]), int(r[3]), r[2]) for r in await conn.fetch(_POOLS)}
    revoking = {r[0]: int(r[1]) for r in await conn.fetch(_REVOKING)}
    return Book(rows, tree, {**of, **cohorts}, dict(waiting), pools, revoking)


# --- the checks ----------------------------------------------------------------------------

def orphaned(h: Holder, book: Book) -> None:
    """Fail unless every unit ``h`` holds is of use to it: it waits as a displacement or a
    nomination, its quota admits it, and its plan still uses each pool it holds on."""
    assert h.code in (NOMINATED, *DISPLACING), (
        f"{h.task_id} holds {h.held} but is pending {h.code}")
    refused = book.refuse(h)
    assert refused is None, f"{h.code} {h.task_id} holds {h.held}; its quota refuses it: " \
        f"{getattr(refused, 'message', refused)}"
    if h.code == NOMINATED:
        assert h.nominated, f"nominee {h.task_id} without nominations holds {h.held}"
        for pool in h.held:
            assert pool in h.nominated, f"nominee {h.task_id} holds {pool}, not its pools"
        for pool, need in h.nominated.items():
            total, _, status = book.pools[pool]
            assert status == "ACTIVE" and total >= need, (
                f"nominee {h.task_id} keeps {h.held} for {pool} ({status}, {total}m) "
                f"where it needs {need}m")
    else:
        assert h.victims, f"{h.code} {h.task_id} holds {h.held} with no victim left"


def stuck(h: Holder, was: int, book: Book, *, now: datetime) -> None:
    """Fail when ``h`` held after the previous pass too and made no progress (see the test
    module's doc)."""
    if sum(h.held.values()) > was:
        return  # its outstanding need shrank
    if h.code in DISPLACING:
        late = [v for v in h.victims if now > v[2] + timedelta(seconds=STEP_MAX)]
        assert not late, f"{h.task_id} waits on victims past revokeBy plus a pass: {late}"
        return
    # A nominee waits for the leases on its pools: what it lacks on each must be reserved
    # by live leases there, which give it to it as they end.
    for pool, need in h.nominated.items():
        _, leased, _ = book.pools[pool]
        short = need - h.held.get(pool, 0)
        assert short <= leased, (
            f"nominee {h.task_id} holds {h.held} two passes on; it lacks {short}m on {pool} "
            f"where leases reserve only {leased}m")
