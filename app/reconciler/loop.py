"""The reconciler: passes driven by wakeups and a tick, shard ownership, lease recovery.

``Reconciler.run_once()`` is one pass over the slots owned now (tests and benchmarks call it
directly). ``Reconciler.run(stop)`` is the loop. It first reads the pools ahead
(:meth:`Reconciler.read_ahead`), so that its first pass reads only the rows written since, as
every later one does, instead of every pool while it holds its claims; then:

* LISTEN on the wakeup channel: every notification triggers a pass at once; any source but
  ``submitted`` first unparks the parked tasks of the owned slots *that it could help*
  (their wake keys overlap the wakeup's: capacity released on a pool they were near, a pool
  of their runtime class added, activated, healthy again or raised, see
  :mod:`app.scheduling.parking`); wakeups received during a pass are applied after it;
* a pass that filled its batch, whose placements unparked tasks, or that handed placements
  back after losing every reservation round (claimable again at once), is followed by another
  at once; otherwise the loop sleeps until a wakeup, the tick (a pass that claims only what
  is claimable: it unparks nothing), a rebalance of dynamic ownership, a recovery round, or
  the safety sweep (every ``park_sweep_seconds``, jittered: every parked task of the owned
  slots is re-examined, in case a notification was missed);
* the leader recovers expired leases, revokes the leases of pools whose drain deadline
  passed and the revoking leases of preemption victims whose grace period ended, and
  unparks preemptors none of whose victims is still revoking; and (every ``sweep_seconds``)
  deletes idempotency records older than their retention, and finished tasks (with their
  events and leases) older than ``finished_retention_seconds``, in batches of ``sweep_batch``
  rows, each batch its own transaction;
* a failing pass is logged loudly and the loop carries on after a pause; its claims expire.

Stopping finishes the current pass and releases the locks; cancelling the task abandons
the pass (its transaction rolls back, its claims expire).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.db import Connection, Database
from app.ledger.capacity import capacity_totals_read
from app.ledger.claims import tasks_unpark, tasks_wake
from app.ledger.cohorts import cohorts_usage_read
from app.ledger.idempotency import idempotency_records_expire
from app.ledger.leases import pool_leases_revoke
from app.ledger.nominations import nominations_held, nominations_recover
from app.ledger.pass_records import pass_records_prune
from app.ledger.preemption import preemptors_unpark, victims_revoke_overdue
from app.ledger.queue import queue_pending_by_code
from app.ledger.quotas import quota_usage_read
from app.ledger.recovery import leases_expired_recover, pools_drain_overdue
from app.ledger.retention import tasks_finished_prune
from app.ledger.snapshot import SnapshotCache
from app.ledger.wakeups import WakeSource, Wakeup, wakeup_keys
from app.metrics import (
    COHORT_BORROWED,
    COHORT_CAP,
    COHORT_USED,
    IDEMPOTENCY_RECORDS_EXPIRED,
    LEASES_EXPIRED,
    NOMINATION_HELD,
    NOMINATIONS,
    PASS_RECORDS_PRUNED,
    PENDING_EXTRA_CODES,
    POOL_CAPACITY,
    POOL_RESERVED,
    POOL_STATUSES,
    PREEMPTION_VICTIMS,
    QUOTA_BORROWED,
    QUOTA_NOMINAL,
    QUOTA_USED,
    RESOURCES,
    TASKS_PARKED,
    TASKS_PENDING,
    TASKS_PRUNED,
    WAKEUPS,
)
from app.pass_config import ReconcilerConfig
from app.reconciler.listener import WakeupListener
from app.reconciler.ownership import DynamicOwnership, StaticOwnership
from app.reconciler.passes import COMPILED_KEPT, PassContext, PassResult, pass_run
from app.reconciler.reading import snapshot_ahead
from app.reconciler.recording import Recorder
from app.scheduling.reasons import REASONS
from app.scheduling.spec import StoredSpecs
from app.shards import shard_of

log = logging.getLogger("berth.reconciler")

#: Pass results kept in ``Reconciler.results``: each holds its leased task ids and queue
#: waits, some 150 KiB with a full batch of 1,024 (64 of them held up to 10 MiB).
RESULTS_KEPT = 16
#: How often a reconciler refreshes the pending and parked gauges of its owned slots (and
#: the pool capacity gauges).
QUEUE_GAUGES_SECONDS = 15.0
#: The fixed label set of the pending gauge.
PENDING_LABELS = (*(str(r) for r in REASONS), *PENDING_EXTRA_CODES)
#: Pause after a pass failed with a non-transient error before the loop tries again.
FAILURE_PAUSE_SECONDS = 1.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class WakeBacklog:
    """Wakeups received and not applied yet: a broad flag and what the others named."""

    def __init__(self) -> None:
        self.broad = True  # a new reconciler looks at everything parked once
        self.released: set[str] = set()
        self.changed: set[str] = set()
        self.instances: set[str] = set()

    def __bool__(self) -> bool:
        return self.broad or bool(self.released or self.changed or self.instances)

    def add(self, wakeup: Wakeup) -> None:
        """Record what ``wakeup`` could help."""
        if wakeup.source is WakeSource.SUBMITTED:
            return
        if wakeup.broad:
            self.broad = True
            return
        target = self.released if wakeup.source is WakeSource.CAPACITY_RELEASED else self.changed
        target.update(wakeup.pools or ())
        self.instances.update(wakeup.instances or ())

    def take(self) -> WakeBacklog:
        """Return the backlog and start an empty one."""
        taken = WakeBacklog()
        taken.broad, self.broad = self.broad, False
        taken.released, self.released = self.released, set()
        taken.changed, self.changed = self.changed, set()
        taken.instances, self.instances = self.instances, set()
        return taken

    def merge(self, other: WakeBacklog) -> None:
        """Put back a backlog that could not be applied."""
        self.broad |= other.broad
        self.released |= other.released
        self.changed |= other.changed
        self.instances |= other.instances


def sweep_delay(seconds: float, rng: Callable[[], float]) -> float:
    """Return the delay until the next safety sweep: ``seconds`` jittered by ±25 %, so that
    replicas started together do not sweep together."""
    return seconds * (0.75 + 0.5 * rng())


def owner_id_default() -> str:
    """Return a replica id unique across hosts and processes."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Reconciler:
    """Turn admitted tasks of the owned shard slots into leased placements."""

    def __init__(
        self,
        db: Database,
        config: ReconcilerConfig,
        *,
        owner_id: str | None = None,
        slots: frozenset[int] | None = None,
        rng: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        pass_guard: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self.db = db
        self.config = config
        self.owner_id = owner_id or owner_id_default()
        self.ownership: StaticOwnership | DynamicOwnership = (
            DynamicOwnership(db, owner_id=self.owner_id)
            if slots is None
            else StaticOwnership(frozenset(slots), db=db, owner_id=self.owner_id)
        )
        self._rng = rng
        self._sleep = sleep
        #: What every pass runs inside (see :class:`PassContext`).
        self._pass_guard = pass_guard
        self._passes = 0
        #: Makes pass ids unique even when two reconcilers are given the same owner id (a
        #: restarted replica, tests): recorded passes are looked up by them.
        self._run = uuid.uuid4().hex[:6]
        self._wake = asyncio.Event()
        self._backlog = WakeBacklog()
        self._compiled = StoredSpecs(COMPILED_KEPT)
        self._snapshot_cache = SnapshotCache()
        self._recorder = (Recorder(config.pass_records_seconds)
                          if config.pass_records_seconds > 0 else None)
        #: The most recent pass results, newest last (for operators and tests).
        self.results: deque[PassResult] = deque(maxlen=RESULTS_KEPT)

    @property
    def slots(self) -> frozenset[int]:
        """Return the slots owned now."""
        return self.ownership.slots

    async def run_once(self, *, now: datetime | None = None) -> PassResult:
        """Run one pass over the owned slots at ``now`` (default: the current time)."""
        if isinstance(self.ownership, DynamicOwnership) and self.ownership.member is None:
            await self.ownership.refresh()
        self._passes += 1
        pass_id = f"{self.owner_id}/{self._run}/{self._passes}"
        ctx = PassContext(
            db=self.db,
            config=self.config,
            slots=self.ownership.slots,
            rng=self._rng,
            sleep=self._sleep,
            clock=_utcnow if now is None else None,
            compiled=self._compiled,
            snapshot_cache=self._snapshot_cache,
            rotation=self._passes,
            pass_guard=self._pass_guard,
            recorder=self._recorder,
        )
        result = await pass_run(ctx, pass_id=pass_id, now=now or _utcnow())
        self.results.append(result)
        if result.claimed:
            log.info("pass", extra=result.to_log())
        return result

    async def read_ahead(self, *, now: datetime | None = None) -> None:
        """Read the pools, their ledgers and runtime health into the passes' cache (and
        encode the pools for the pass records) before the first pass, in a transaction of
        its own that claims and writes nothing. ``now`` (default: the wall clock, not the
        passes' clock) only dates the health read: every pass recomputes it at its own."""
        with self._pass_guard():
            async with self.db.transaction() as conn:
                snapshot = await snapshot_ahead(conn, config=self.config,
                                                cache=self._snapshot_cache,
                                                now=now or datetime.now(UTC))
            if self._recorder is not None:
                self._recorder.pools_encoded(snapshot)

    async def close(self) -> None:
        """Release the ownership session (slot and leader locks) of a reconciler used directly.

        ``run()`` does this itself on exit; call it after driving ``run_once()`` by hand with
        dynamic ownership or ``recover_once()``.
        """
        await self.ownership.stop()

    async def unpark(self, *, now: datetime | None = None) -> int:
        """Make every parked task of the owned slots claimable again; return how many."""
        slots = self.ownership.slots
        if not slots:
            return 0
        async with self.db.connection() as conn:  # one statement: atomic on its own
            return await tasks_unpark(conn, slots=slots, now=now or datetime.now(UTC))

    async def wake_apply(self, *, now: datetime | None = None) -> int:
        """Unpark the parked tasks of the owned slots that the wakeups received so far could
        help (all of them after a broad one); return how many."""
        backlog = self._backlog.take()
        if not backlog:
            return 0
        try:
            if backlog.broad:
                return await self.unpark(now=now)
            slots = self.ownership.slots
            if not slots:
                return 0
            async with self.db.connection() as conn:
                keys = await wakeup_keys(
                    conn, released_pools=backlog.released, changed_pools=backlog.changed,
                    healthy_instances=backlog.instances,
                )
                return await tasks_wake(
                    conn, keys=keys, slots=slots, now=now or datetime.now(UTC)
                )
        except BaseException:
            self._backlog.merge(backlog)  # applied next time
            raise

    async def recover_once(self, *, now: datetime | None = None) -> int:
        """As leader, recover expired leases, revoke overdue drains and overdue preemption
        victims, and unpark preemptors whose victims are gone; return tasks recovered."""
        at = now or datetime.now(UTC)
        limit = self.config.recovery_batch

        async def recover(conn: Connection) -> int:
            result = await leases_expired_recover(conn, now=at, limit=limit)
            if result.tasks:
                LEASES_EXPIRED.labels(cause="expired").inc(result.tasks)
                log.info(
                    "expired leases recovered",
                    extra={"owner": self.owner_id, "requeued": result.requeued,
                           "failed": result.failed},
                )
            revoked = 0
            for pool_id in await pools_drain_overdue(conn, now=at):
                n = await pool_leases_revoke(conn, pool_id=pool_id, now=at)
                revoked += n
                log.info("drain deadline passed; leases revoked",
                         extra={"owner": self.owner_id, "pool_id": pool_id, "tasks": n})
            if revoked:
                LEASES_EXPIRED.labels(cause="revoked").inc(revoked)
            preempted = await victims_revoke_overdue(conn, now=at, limit=limit)
            if preempted:
                PREEMPTION_VICTIMS.labels(outcome="revoked").inc(preempted)
                log.info("preemption grace period over; victims revoked and requeued",
                         extra={"owner": self.owner_id, "tasks": preempted})
            await preemptors_unpark(conn, now=at)
            ended = await nominations_recover(conn, now=at)
            for outcome, n in ended.items():
                NOMINATIONS.labels(outcome=outcome).inc(n)
            held = await nominations_held(conn)
            for resource, amount in zip(RESOURCES, held, strict=True):
                NOMINATION_HELD.labels(resource=resource).set(amount)
            return result.tasks + revoked + preempted

        return await self.ownership.as_leader(recover) or 0

    async def _leader_batches(
        self,
        expire: Callable[..., Awaitable[int]],
        *,
        retention_seconds: float,
        now: datetime | None,
        counter: Any,
        what: str,
    ) -> int:
        """As leader, call ``expire(conn, before=now - retention, limit=sweep_batch)`` (one
        batch, its own transaction on the leadership session) up to ``sweep_batches_max``
        times, until a batch comes back short; count and log what went, and return it (0 on
        a replica that is not the leader)."""
        cfg = self.config
        before = (now or datetime.now(UTC)) - timedelta(seconds=retention_seconds)

        async def batch(conn: Connection) -> int:
            return await expire(conn, before=before, limit=cfg.sweep_batch)

        total = 0
        for _ in range(cfg.sweep_batches_max):
            deleted = await self.ownership.as_leader(batch) or 0
            total += deleted
            if deleted < cfg.sweep_batch:
                break
        if total:
            counter.inc(total)
            log.info(what, extra={"owner": self.owner_id, "deleted": total})
        return total

    async def sweep_once(self, *, now: datetime | None = None) -> int:
        """As leader, delete idempotency records older than the retention; return how many.

        Batches of ``sweep_batch`` rows, each its own transaction on the leadership session,
        at most ``sweep_batches_max`` of them; a replica that is not the leader deletes
        nothing.
        """
        return await self._leader_batches(
            idempotency_records_expire,
            retention_seconds=self.config.idempotency_retention_seconds, now=now,
            counter=IDEMPOTENCY_RECORDS_EXPIRED, what="expired idempotency records deleted",
        )

    async def prune_once(self, *, now: datetime | None = None) -> int:
        """As leader, delete the tasks that finished longer than the retention ago, with their
        events and leases, in batches as :meth:`sweep_once`; return how many tasks (0 when
        ``finished_retention_seconds`` is 0: history is kept)."""
        if self.config.finished_retention_seconds <= 0:
            return 0
        return await self._leader_batches(
            tasks_finished_prune, retention_seconds=self.config.finished_retention_seconds,
            now=now, counter=TASKS_PRUNED, what="finished tasks past the retention deleted",
        )

    async def records_prune_once(self, *, now: datetime | None = None) -> int:
        """As leader, delete the pass records older than their retention, in batches as
        :meth:`sweep_once`; return how many (0 when passes are not recorded)."""
        if self.config.pass_records_seconds <= 0:
            return 0
        return await self._leader_batches(
            pass_records_prune, retention_seconds=self.config.pass_records_seconds,
            now=now, counter=PASS_RECORDS_PRUNED, what="pass records past the retention deleted",
        )

    async def _sweeps_run(self) -> None:
        """Run the idempotency, retention and pass-record sweeps; one that fails is logged
        and tried again next round, and does not stop the others."""
        for sweep, what in ((self.sweep_once, "idempotency"), (self.prune_once, "retention"),
                            (self.records_prune_once, "pass records")):
            try:
                await sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(f"{what} sweep failed; the next round tries again",
                              extra={"owner": self.owner_id})

    async def queue_gauges_refresh(self) -> None:
        """Set the pending-by-reason and parked gauges from the owned slots' waiting tasks,
        and the pool capacity gauges from every ledger."""
        async with self.db.connection() as conn:
            rows = await queue_pending_by_code(conn, slots=self.ownership.slots)
            totals = await capacity_totals_read(conn)
        for status in POOL_STATUSES:
            capacity, reserved = totals.get(status, ((0, 0, 0), (0, 0, 0)))
            for i, resource in enumerate(RESOURCES):
                POOL_CAPACITY.labels(resource, status).set(capacity[i])
                POOL_RESERVED.labels(resource, status).set(reserved[i])
        counts = dict.fromkeys(PENDING_LABELS, 0)
        parked = 0
        for code, n, p in rows:
            counts[code if code in counts else "other"] += n
            parked += p
        for code, n in counts.items():
            TASKS_PENDING.labels(reason=code).set(n)
        TASKS_PARKED.set(parked)
        await self.quota_gauges_refresh()

    async def quota_gauges_refresh(self) -> None:
        """Set the quota gauges of the tenants (with a quota) of the owned slots."""
        async with self.db.connection() as conn:
            rows = await quota_usage_read(conn)
            levels = await cohorts_usage_read(conn, cohort_ids=None)
        slots = self.ownership.slots
        for gauge in (QUOTA_NOMINAL, QUOTA_USED, QUOTA_BORROWED):
            gauge.clear()
        for tenant, rc, resource, nominal, used in rows:
            if shard_of(tenant) not in slots:
                continue
            QUOTA_NOMINAL.labels(tenant, rc, resource).set(nominal)
            QUOTA_USED.labels(tenant, rc, resource).set(used)
            QUOTA_BORROWED.labels(tenant, rc, resource).set(max(0, used - nominal))
        for gauge in (COHORT_CAP, COHORT_USED, COHORT_BORROWED):
            gauge.clear()
        for cohort, rc, resource, cap, used in levels:
            if shard_of(cohort) not in slots:
                continue
            COHORT_CAP.labels(cohort, rc, resource).set(cap)
            COHORT_USED.labels(cohort, rc, resource).set(used)
            COHORT_BORROWED.labels(cohort, rc, resource).set(max(0, used - cap))

    def wakeup(self, wakeup: Wakeup | WakeSource) -> None:
        """Count a wakeup and trigger a pass; any source but ``submitted`` first unparks the
        parked tasks it could help (a bare source: all of them)."""
        if isinstance(wakeup, WakeSource):
            wakeup = Wakeup(wakeup)
        WAKEUPS.labels(source=wakeup.source.value).inc()
        self._backlog.add(wakeup)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Run passes until ``stop`` is set; then release every lock and connection."""
        cfg = self.config
        # Before listening: whoever waits for a reconciler to listen (`berth bench e2e` does)
        # finds one whose first pass will not read every pool.
        await self._logged(self.read_ahead(),
                           "pools not read ahead; the first pass reads them")
        listener = WakeupListener(self.db, self.wakeup)
        await listener.ensure()
        await self.ownership.start()
        log.info("reconciler started",
                 extra={"owner": self.owner_id, "policy": cfg.policy,
                        "slots_owned": len(self.ownership.slots)})
        due = _Due.start(cfg, self._rng)
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                await self._chores(due, listener)
                full = await self._pass_guarded(stop)
                if full is None:
                    # The database may have restarted: reconnect the LISTEN and ownership
                    # sessions now rather than at the next rebalance.
                    due.rebalance = time.monotonic()
                    continue
                if full or self._wake.is_set():
                    continue
                wait = due.next() - time.monotonic()
                if wait > 0:
                    waker = asyncio.ensure_future(self._wake.wait())
                    await asyncio.wait({waker, stopper}, timeout=wait,
                                       return_when=asyncio.FIRST_COMPLETED)
                    waker.cancel()
        finally:
            stopper.cancel()
            await listener.close()
            await self.ownership.stop()
            log.info("reconciler stopped", extra={"owner": self.owner_id})

    async def _chores(self, due: _Due, listener: WakeupListener) -> None:
        """Do what is due before a pass: rebalance slots, count a tick, wake a park sweep,
        refresh the queue gauges, recover leases, run the retention sweeps."""
        cfg = self.config
        t = time.monotonic()
        if t >= due.rebalance:
            before = self.ownership.slots
            if await listener.ensure():
                self._backlog.broad = True  # notifications may have been missed
            if await self.ownership.refresh() - before:
                self._backlog.broad = True  # taken-over slots may hold parked tasks
            due.rebalance = t + cfg.rebalance_seconds
        if t >= due.tick:
            # A pass for what is claimable (expired claims); it unparks nothing.
            WAKEUPS.labels(source=WakeSource.TICK.value).inc()
            due.tick = t + cfg.tick_seconds
        if t >= due.sweep:
            self.wakeup(Wakeup(WakeSource.SWEEP))
            due.sweep = t + sweep_delay(cfg.park_sweep_seconds, self._rng)
        if t >= due.gauges:
            due.gauges = t + QUEUE_GAUGES_SECONDS
            await self._logged(self.queue_gauges_refresh(), "queue gauges not refreshed")
        if t >= due.recovery:
            due.recovery = t + cfg.recovery_seconds
            await self._logged(self.recover_once(),
                               "lease recovery failed; the next round tries again")
        if t >= due.expiry:
            due.expiry = t + cfg.sweep_seconds
            await self._sweeps_run()

    async def _logged(self, work: Awaitable[object], message: str) -> None:
        """Await ``work``; log its failure (the loop goes on) unless it was cancelled."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(message, extra={"owner": self.owner_id})

    async def _pass_guarded(self, stop: asyncio.Event) -> bool | None:
        """Apply the wakeups received and run a pass; return whether another pass should
        follow at once (a full batch, unparked tasks, placements handed back after lost races),
        or None when it failed (after a pause)."""
        try:
            # Clear first: a wakeup that arrives from here on triggers another pass.
            self._wake.clear()
            await self.wake_apply()
            result = await self.run_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconcile pass failed; its claims will expire",
                          extra={"owner": self.owner_id})
            await self._pause(stop, FAILURE_PAUSE_SECONDS)
            return None
        if result.woken:
            WAKEUPS.labels(source=WakeSource.TASK_PLACED.value).inc()
        return (result.claimed >= self.config.batch_size or result.woken > 0
                or result.requeued > 0)

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        try:
            await asyncio.wait_for(stop.wait(), timeout=seconds)
        except TimeoutError:
            pass


@dataclass(slots=True)
class _Due:
    """When each of the loop's chores is next due (``time.monotonic()``)."""

    tick: float
    sweep: float
    rebalance: float
    recovery: float
    expiry: float
    gauges: float

    @classmethod
    def start(cls, cfg: ReconcilerConfig, rng: Callable[[], float]) -> _Due:
        """Return the first due times: recovery, sweeps and gauges at once."""
        now = time.monotonic()
        return cls(tick=now + cfg.tick_seconds,
                   sweep=now + sweep_delay(cfg.park_sweep_seconds, rng),
                   rebalance=now + cfg.rebalance_seconds,
                   recovery=now, expiry=now, gauges=now)

    def next(self) -> float:
        """Return when the first chore is due."""
        return min(self.tick, self.rebalance, self.recovery, self.sweep, self.expiry,
                   self.gauges)
