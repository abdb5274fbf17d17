"""The reconciler: passes driven by wakeups and a tick, shard ownership, lease recovery.

``Reconciler.run_once()`` is one pass over the slots owned now (tests and benchmarks call it
directly). ``Reconciler.run(stop)`` is the loop:

* LISTEN on the wakeup channel: every notification triggers a pass at once; any source but
  ``submitted`` first unparks the parked tasks of the owned slots (capacity was released,
  a pool was added, activated, became healthy, or its totals rose);
* a pass that filled its batch is followed by another at once; otherwise the loop sleeps
  until a wakeup, the tick (which also unparks: the safety net for a missed notification),
  a rebalance of dynamic ownership, or a recovery round;
* the leader recovers expired leases, revokes the leases of pools whose drain deadline
  passed and the revoking leases of preemption victims whose grace period ended, and
  unparks preemptors none of whose victims is still revoking;
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
from datetime import UTC, datetime

from app.db import Connection, Database
from app.ledger.claims import tasks_unpark
from app.ledger.leases import pool_leases_revoke
from app.ledger.preemption import preemptors_unpark, victims_revoke_overdue
from app.ledger.recovery import leases_expired_recover, pools_drain_overdue
from app.ledger.snapshot import SnapshotCache
from app.ledger.wakeups import WakeSource
from app.metrics import LEASES_EXPIRED, PREEMPTION_VICTIMS, WAKEUPS
from app.reconciler.config import ReconcilerConfig
from app.reconciler.listener import WakeupListener
from app.reconciler.ownership import DynamicOwnership, StaticOwnership
from app.reconciler.passes import PassContext, PassResult, pass_run

log = logging.getLogger("berth.reconciler")

#: Pass results kept in ``Reconciler.results``.
RESULTS_KEPT = 64
#: Pause after a pass failed with a non-transient error before the loop tries again.
FAILURE_PAUSE_SECONDS = 1.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


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
        self._passes = 0
        self._wake = asyncio.Event()
        self._unpark = True
        self._compiled: dict = {}
        self._snapshot_cache = SnapshotCache()
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
        pass_id = f"{self.owner_id}/{self._passes}"
        ctx = PassContext(
            db=self.db,
            config=self.config,
            claim_owner=pass_id,
            slots=self.ownership.slots,
            rng=self._rng,
            sleep=self._sleep,
            clock=_utcnow if now is None else None,
            compiled=self._compiled,
            snapshot_cache=self._snapshot_cache,
            rotation=self._passes,
        )
        result = await pass_run(ctx, pass_id=pass_id, now=now or _utcnow())
        self.results.append(result)
        if result.claimed:
            log.info("pass", extra=result.to_log())
        return result

    async def close(self) -> None:
        """Release the ownership session (slot and leader locks) of a reconciler used directly.

        ``run()`` does this itself on exit; call it after driving ``run_once()`` by hand with
        dynamic ownership or ``recover_once()``.
        """
        await self.ownership.stop()

    async def unpark(self, *, now: datetime | None = None) -> int:
        """Make the parked tasks of the owned slots claimable again; return how many."""
        slots = self.ownership.slots
        if not slots:
            return 0
        async with self.db.connection() as conn:  # one statement: atomic on its own
            return await tasks_unpark(conn, slots=slots, now=now or datetime.now(UTC))

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
            return result.tasks + revoked + preempted

        return await self.ownership.as_leader(recover) or 0

    def wakeup(self, source: WakeSource) -> None:
        """Count a wakeup and trigger a pass; any source but ``submitted`` unparks first."""
        WAKEUPS.labels(source=source.value).inc()
        if source is not WakeSource.SUBMITTED:
            self._unpark = True
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Run passes until ``stop`` is set; then release every lock and connection."""
        cfg = self.config
        listener = WakeupListener(self.db, self.wakeup)
        await listener.ensure()
        await self.ownership.start()
        log.info("reconciler started",
                 extra={"owner": self.owner_id, "policy": cfg.policy,
                        "slots_owned": len(self.ownership.slots)})
        clock = time.monotonic
        next_tick = clock() + cfg.tick_seconds
        next_rebalance = clock() + cfg.rebalance_seconds
        next_recovery = clock()
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                t = clock()
                if t >= next_rebalance:
                    before = self.ownership.slots
                    if await listener.ensure():
                        self._unpark = True  # notifications may have been missed meanwhile
                    if await self.ownership.refresh() - before:
                        self._unpark = True  # taken-over slots may hold parked tasks
                    next_rebalance = t + cfg.rebalance_seconds
                if t >= next_tick:
                    self.wakeup(WakeSource.TICK)
                    next_tick = t + cfg.tick_seconds
                full = False
                if t >= next_recovery:
                    next_recovery = t + cfg.recovery_seconds
                    try:
                        await self.recover_once()
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("lease recovery failed; the next round tries again",
                                      extra={"owner": self.owner_id})
                try:
                    # Clear first: a wakeup that arrives from here on triggers another pass.
                    self._wake.clear()
                    if self._unpark:
                        self._unpark = False
                        try:
                            await self.unpark()
                        except BaseException:
                            self._unpark = True
                            raise
                    result = await self.run_once()
                    full = result.claimed >= cfg.batch_size
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("reconcile pass failed; its claims will expire",
                                  extra={"owner": self.owner_id})
                    await self._pause(stop, FAILURE_PAUSE_SECONDS)
                    continue
                if full or self._wake.is_set() or self._unpark:
                    continue
                wait = min(next_tick, next_rebalance, next_recovery) - clock()
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

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        try:
            await asyncio.wait_for(stop.wait(), timeout=seconds)
        except TimeoutError:
            pass
