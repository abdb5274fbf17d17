"""No starvation: a task that stays first of its priority and does not fit is nominated, and
the capacity freed on its pools is held for it until it fits (time is simulated)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from app.api.task_schemas import pending_reason_json
from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.invariants import ledger_check
from app.ledger.leases import lease_complete, runtime_heartbeat, task_cancel
from app.ledger.queue import queue_pending_counts
from app.ledger.wakeups import WakeSource, Wakeup
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, ledger_violations, pool_add, spec_make, task_events, tasks_add

ALL = frozenset(range(SHARD_SLOTS))
#: The stream: a 1-core task every STEP seconds, each running RUN seconds.
STEP = 0.25
RUN = 1.5
NOMINATION = 3.0


def reconciler(db: Database, nomination: float, policy: str = "fifo") -> Reconciler:
    return Reconciler(db, ReconcilerConfig(nomination_seconds=nomination, policy=policy),
                      owner_id="nom", slots=ALL)


class Stream:
    """A stream of small tasks on some pools, and the clock of the simulation."""

    def __init__(self, db: Database, rec: Reconciler, pools: list[str]) -> None:
        self.db, self.rec, self.pools = db, rec, pools
        self.t = 0.0
        self.small: list[uuid.UUID] = []

    @property
    def now(self) -> datetime:
        return NOW + timedelta(seconds=self.t)

    async def submit(self, spec: dict, count: int = 1) -> list[uuid.UUID]:
        async with self.db.transaction() as conn:
            return await tasks_add(conn, tenant="t1", count=count, spec=spec,
                                   admitted_at=self.now)

    async def step(self) -> None:
        """Finish the leases that ran RUN seconds, submit one small task, wake and pass."""
        now = self.now
        async with self.db.transaction() as conn:
            for p in self.pools:
                await runtime_heartbeat(conn, instance_id=f"rt-{p}", now=now,
                                        lease_ttl_seconds=600)
            done = await conn.fetch(
                "SELECT l.id, l.epoch FROM leases l WHERE l.state = 'ACTIVE' "
                "AND l.granted_at <= $1 ORDER BY l.id", now - timedelta(seconds=RUN))
        released = set()
        for lease_id, epoch in done:
            async with self.db.transaction() as conn:
                out = await lease_complete(conn, lease_id=lease_id, epoch=epoch,
                                           outcome="succeeded", message=None, now=now)
                assert out["state"] == "SUCCEEDED"
            released.update(self.pools)
        self.small += await self.submit(spec_make(cpu=1000))
        if released:
            self.rec.wakeup(Wakeup(WakeSource.CAPACITY_RELEASED, pools=tuple(sorted(released))))
            await self.rec.wake_apply(now=now)
        await self.rec.run_once(now=now)
        await self.rec.recover_once(now=now)
        assert await ledger_violations(self.db) == []
        self.t = round(self.t + STEP, 6)

    async def state(self, task_id: uuid.UUID) -> tuple[str, datetime | None]:
        async with self.db.connection() as conn:
            r = await conn.fetchrow("SELECT state, leased_at FROM tasks WHERE id = $1", task_id)
        return r[0], r[1]

    async def running_small(self) -> int:
        async with self.db.connection() as conn:
            return int(await conn.fetchval(
                "SELECT count(*) FROM tasks WHERE state = 'LEASED' AND id = ANY($1::uuid[])",
                self.small))

    async def step_until_held(self, task_id: uuid.UUID) -> int:
        """Step until the task holds capacity (its nomination's holds), at most 20 s of
        stream time; return the cpu it holds."""
        held = 0
        while self.t < 20 and not held:
            await self.step()
            async with self.db.connection() as conn:
                held = int(await conn.fetchval(
                    "SELECT coalesce(sum(cpu), 0) FROM reservations WHERE task_id = $1",
                    task_id))
        return held


async def _start(
    db: Database, pools: dict[str, int], nomination: float, policy: str = "fifo"
) -> Stream:
    async with db.transaction() as conn:
        for p, cores in pools.items():
            await pool_add(conn, p, tenants=["t1"], capacity=(cores * 1000, 65536, 0))
            await runtime_heartbeat(conn, instance_id=f"rt-{p}", now=NOW, lease_ttl_seconds=600)
    stream = Stream(db, reconciler(db, nomination, policy), sorted(pools))
    cores = sum(pools.values())
    stream.small += await stream.submit(spec_make(cpu=1000), count=cores)
    await stream.rec.run_once(now=NOW)
    assert await stream.running_small() == cores
    # The running tasks started one after another: one ends every RUN / cores seconds.
    async with db.transaction() as conn:
        await conn.execute(
            "UPDATE leases l SET granted_at = "
            "$1::timestamptz - (o.n - 1) * $2::float8 * interval '1 second' "
            "FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM leases) o "
            "WHERE o.id = l.id", NOW, RUN / cores)
    # A backlog of small tasks queued ahead of the big one.
    stream.small += await stream.submit(spec_make(cpu=1000), count=2)
    stream.t = STEP
    return stream


async def test_without_nomination_the_big_task_starves(db: Database) -> None:
    stream = await _start(db, {"p1": 4}, nomination=0)
    (big,) = await stream.submit(spec_make(cpu=4000))
    while stream.t < 20:
        await stream.step()
    assert (await stream.state(big))[0] == "ADMITTED"
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM nominations") == 0


async def test_a_4_core_task_behind_a_stream_of_1_core_tasks_is_leased_in_bounded_time(
    db: Database,
) -> None:
    stream = await _start(db, {"p1": 4}, nomination=NOMINATION)
    (big,) = await stream.submit(spec_make(cpu=4000))
    admitted = stream.now
    nominated_at = None
    while stream.t < 20:
        await stream.step()
        state, leased_at = await stream.state(big)
        if nominated_at is None:
            async with db.connection() as conn:
                if await conn.fetchval("SELECT count(*) FROM nominations WHERE task_id = $1",
                                       big):
                    nominated_at = stream.t
                    # Every small task admitted before it was placed: it is first now.
                    pending = await conn.fetchval(
                        "SELECT pending_reason FROM tasks WHERE id = $1", big)
                    assert pending["code"] == "nominated"
                    assert pending["poolIds"] == ["p1"]
                    assert pending["need"]["cpuMillis"] == 4000
                    assert 0 <= pending["held"]["cpuMillis"] <= 4000
                    # The API shows the nomination in the task's pending reason.
                    shown = pending_reason_json(pending)
                    assert shown is not None and shown["code"] == "nominated"
                    assert shown.get("poolIds") == ["p1"]
                    assert shown.get("nominatedAt") == pending["nominatedAt"]
                    # GET /v1/queue counts it under its code.
                    counts = await queue_pending_counts(conn, tenant_ids=["t1"], pool_ids=None)
                    assert ("standard", "nominated", 1, 1) in [c[:4] for c in counts]
        if state == "LEASED":
            break
    assert state == "LEASED" and leased_at is not None and nominated_at is not None
    # Leased within the nomination time + the longest running lease + one pass (a step).
    assert (leased_at - admitted).total_seconds() <= NOMINATION + RUN + 2 * STEP
    reasons = [r for r, _ in await task_events(db, big)]
    assert "nominated" in reasons
    assert ("nomination_ended", {"outcome": "placed"}) in await task_events(db, big)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM nominations") == 0
        # Its holds became its lease: nothing else held.
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE hold") == 0
        # No small task was displaced: they ran to completion.
        assert await conn.fetchval(
            "SELECT count(*) FROM leases WHERE state NOT IN ('ACTIVE', 'COMPLETED')") == 0
        assert all(v == 0 for v in (await ledger_check(conn)).values())
    # Once it finished, the stream runs again.
    for _ in range(int(RUN / STEP) + 3):
        await stream.step()
    assert (await stream.state(big))[0] == "SUCCEEDED"
    assert await stream.running_small() >= 1


async def test_a_gang_of_4_across_2_pools_with_backfill_on_a_third(db: Database) -> None:
    stream = await _start(db, {"p1": 4, "p2": 4, "p3": 2}, nomination=NOMINATION)
    (gang,) = await stream.submit(spec_make(cpu=2000, gang={"members": 4, "minPools": 2}))
    admitted = stream.now
    backfilled: set[uuid.UUID] = set()
    nominated = False
    while stream.t < 30:
        await stream.step()
        async with db.connection() as conn:
            pools = {r[0] for r in await conn.fetch(
                "SELECT pool_id FROM nominations WHERE task_id = $1", gang)}
            if pools:
                nominated = True
                # The third pool is not nominated: small tasks keep starting there.
                assert pools == {"p1", "p2"}
                backfilled |= {r[0] for r in await conn.fetch(
                    "SELECT task_id FROM leases WHERE pool_id = 'p3' AND granted_at = $1",
                    stream.now - timedelta(seconds=STEP))}
        state, leased_at = await stream.state(gang)
        if state == "LEASED":
            break
    assert nominated and state == "LEASED" and leased_at is not None
    assert (leased_at - admitted).total_seconds() <= NOMINATION + RUN + 2 * STEP
    assert backfilled, "small tasks kept starting on capacity not held"
    async with db.connection() as conn:
        members = await conn.fetch(
            "SELECT pool_id, members FROM reservations WHERE task_id = $1 ORDER BY pool_id",
            gang)
        assert [(r[0], r[1]) for r in members] == [("p1", 2), ("p2", 2)]
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE hold") == 0
        assert all(v == 0 for v in (await ledger_check(conn)).values())


async def test_a_cancelled_nominee_gives_its_holds_back_at_once(db: Database) -> None:
    stream = await _start(db, {"p1": 4}, nomination=NOMINATION)
    (big,) = await stream.submit(spec_make(cpu=4000))
    assert await stream.step_until_held(big) > 0
    async with db.transaction() as conn:
        await task_cancel(conn, task_id=big, tenant_id="t1", now=stream.now)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE hold") == 0
    assert await ledger_violations(db) == []
    await stream.rec.recover_once(now=stream.now)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM nominations") == 0
    assert ("nomination_ended", {"outcome": "cancelled"}) in await task_events(db, big)
    # The stream takes the capacity again.
    for _ in range(4):
        await stream.step()
    assert await stream.running_small() == 4


async def test_higher_priority_work_is_not_held_back(db: Database) -> None:
    stream = await _start(db, {"p1": 4}, nomination=NOMINATION, policy="priority")
    (big,) = await stream.submit(spec_make(cpu=4000))
    while stream.t < 20:
        await stream.step()
        async with db.connection() as conn:
            if await conn.fetchval("SELECT count(*) FROM nominations"):
                break
    (urgent,) = await stream.submit(spec_make(cpu=1000, priority=5))
    for _ in range(4):
        await stream.step()
        if (await stream.state(urgent))[0] == "LEASED":
            break
    assert (await stream.state(urgent))[0] == "LEASED"
    assert ("nomination_ended", {"outcome": "passed"}) in await task_events(db, big)


async def test_a_nominee_its_pool_can_no_longer_help_gives_its_holds_back(db: Database) -> None:
    stream = await _start(db, {"p1": 4, "p2": 1}, nomination=NOMINATION)
    (big,) = await stream.submit(spec_make(cpu=4000))
    assert await stream.step_until_held(big) > 0
    async with db.transaction() as conn:
        await conn.execute("UPDATE pools SET status = 'CORDONED' WHERE id = 'p1'")
        await conn.execute("UPDATE tasks SET parked = false WHERE id = $1", big)
    stream.rec = reconciler(db, NOMINATION)  # a fresh snapshot of the pools
    await stream.rec.run_once(now=stream.now)
    assert ("nomination_ended", {"outcome": "stale"}) in await task_events(db, big)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM reservations WHERE hold") == 0
        assert await conn.fetchval("SELECT count(*) FROM nominations") == 0
    assert await ledger_violations(db) == []
