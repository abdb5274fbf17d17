"""Queue position under each policy, and an ETA given only when it can honestly be."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.config import SHARD_SLOTS, Settings
from app.db import Database
from app.ledger.tasks import task_get
from app.reconciler import Reconciler, ReconcilerConfig
from app.scheduling.policies import QueuedTask, get_policy
from app.scheduling.reasons import Stage
from app.services.offload import Offload
from app.services.queue import task_queue
from tests.factories import pool_add, spec_make, tasks_add

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ALL = frozenset(range(SHARD_SLOTS))


def _settings(policy: str = "fifo", **kw) -> Settings:
    return Settings(policy=policy, priority_aging_seconds=60.0, **kw)


async def _read(db: Database, task_id, settings: Settings, now: datetime = NOW) -> dict:
    offload = Offload(workers=0, max_concurrent=2, timeout_seconds=60.0, database_url=db.url)
    try:
        async with db.connection() as conn:
            tenant = await conn.fetchval("SELECT tenant_id FROM tasks WHERE id = $1", task_id)
            row = await task_get(conn, task_id=task_id, tenant_ids=[tenant])
            return await task_queue(conn, row=row, settings=settings, now=now, offload=offload)
    finally:
        offload.close()


async def _policy_positions(db: Database, policy: str) -> dict[uuid.UUID, int]:
    """Return each competing task's position in the policy's own order (1-based)."""
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT id, tenant_id, priority, seq, admitted_at, spec FROM tasks "
            "WHERE state = 'ADMITTED' AND runtime_class = 'standard' "
            "AND (pending_stage IS NULL OR pending_stage >= 4)")
    queued = [QueuedTask(str(r[0]), r[1], r[2], r[3], r[4].timestamp(),
                         (int(r[5]["requests"]["cpuMillis"]), 0, 0)) for r in rows]
    options = {"aging_seconds": 60.0} if policy == "priority" else {}
    ordered = get_policy(policy, **options).order(
        queued, now=NOW.timestamp(), tenant_usage={}, cluster_capacity=(100000, 1, 1))
    return {uuid.UUID(q.task_id): i + 1 for i, q in enumerate(ordered)}


@pytest.fixture
async def mixed_queue(db: Database) -> dict[str, uuid.UUID]:
    """Tasks of two tenants that share a pool, in one runtime class, plus tasks that compete
    for nothing."""
    async with db.transaction() as conn:
        await pool_add(conn, "shared", tenants=["t-a", "t-b"], capacity=None)
        a = await tasks_add(conn, tenant="t-a", specs=[
            spec_make(priority=0), spec_make(priority=3), spec_make(priority=0),
            spec_make(priority=0)], admitted_at=NOW - timedelta(seconds=600))
        (b,) = await tasks_add(conn, tenant="t-b", spec=spec_make(priority=5), admitted_at=NOW)
        (other_class,) = await tasks_add(conn, tenant="t-b", spec=spec_make(runtime_class="gpu"))
        (stuck,) = await tasks_add(conn, tenant="t-a", spec=spec_make(), admitted_at=NOW)
        # Pending for a reason no released capacity can help: it competes for nothing.
        await conn.execute("UPDATE tasks SET pending_stage = 1, parked = true, pending_reason = "
                           "'{\"code\": \"runtime_class_mismatch\", \"message\": \"m\"}' "
                           "WHERE id = $1", stuck)
        await conn.execute("UPDATE tasks SET admitted_at = $2 WHERE id = $1",
                           a[1], NOW - timedelta(seconds=180))
    return {"a0": a[0], "a1": a[1], "a2": a[2], "a3": a[3], "b": b,
            "other_class": other_class, "stuck": stuck}


@pytest.mark.parametrize(("policy", "expected"), [
    ("fifo", {"a0": 1, "a1": 2, "a2": 3, "a3": 4, "b": 5}),
    # Effective priority (one point a minute): a0, a2, a3 at 10; a1 at 3 + 3 = 6; b at 5.
    ("priority", {"a0": 1, "a2": 2, "a3": 3, "a1": 4, "b": 5}),
    # Dominant-resource fairness with equal shares: the tenants take turns.
    ("fair", {"a0": 1, "b": 2, "a1": 3, "a2": 4, "a3": 5}),
], ids=["fifo", "priority-with-aging", "fair"])
async def test_position_under_each_policy_matches_the_policys_own_order(
    db: Database, mixed_queue: dict[str, uuid.UUID], policy: str, expected: dict[str, int],
) -> None:
    settings = _settings(policy)
    own_order = await _policy_positions(db, policy)
    for name, position in expected.items():
        queue = await _read(db, mixed_queue[name], settings)
        assert (name, queue["position"]) == (name, position)
        assert own_order[mixed_queue[name]] == position
        assert queue["competing"] == 5 and queue["exact"] and queue["policy"] == policy
    # Another runtime class competes with no one here; a task stuck for its runtime class
    # is not counted among the competitors (nor would it be placed before them).
    assert (await _read(db, mixed_queue["other_class"], settings))["competing"] == 1


async def test_counts_past_the_read_bound_are_lower_bounds(
    db: Database, mixed_queue: dict[str, uuid.UUID]
) -> None:
    queue = await _read(db, mixed_queue["b"], _settings("fifo", queue_count_limit=3))
    assert (queue["position"], queue["competing"], queue["exact"]) == (4, 3, False)


async def _park(db: Database) -> Reconciler:
    reconciler = Reconciler(db, ReconcilerConfig(), owner_id="eta", slots=ALL)
    await reconciler.run_once(now=NOW)
    return reconciler


async def _completed(db: Database, pool_id: str, ages_seconds: list[float]) -> None:
    async with db.transaction() as conn:
        ids = await tasks_add(conn, tenant="t-a", count=len(ages_seconds))
        for task_id, age in zip(ids, ages_seconds, strict=True):
            await conn.execute("UPDATE tasks SET state = 'SUCCEEDED' WHERE id = $1", task_id)
            await conn.execute(
                "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
                "granted_at, expires_at, ended_at) VALUES "
                "(gen_random_uuid(), $1, $2, 'rt', 1, 'COMPLETED', $3, $3, $3)",
                task_id, pool_id, NOW - timedelta(seconds=age))


async def _live(db: Database, pool_id: str, ages_seconds: list[float], *, cpu: int,
                tenant: str = "t-a") -> None:
    """Lease one task of ``cpu`` on ``pool_id`` per age (granted that long ago), with its
    reservation counted in the pool's ledger."""
    async with db.transaction() as conn:
        ids = await tasks_add(conn, tenant=tenant, count=len(ages_seconds),
                              spec=spec_make(cpu=cpu))
        for task_id, age in zip(ids, ages_seconds, strict=True):
            await conn.execute("UPDATE tasks SET state = 'LEASED' WHERE id = $1", task_id)
            await conn.execute(
                "INSERT INTO reservations (task_id, pool_id, cpu, memory, llm) "
                "VALUES ($1, $2, $3, 0, 0)", task_id, pool_id, cpu)
            await conn.execute(
                "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, state, "
                "granted_at, expires_at) VALUES "
                "(gen_random_uuid(), $1, $2, 'rt', 1, 'ACTIVE', $3, $4)",
                task_id, pool_id, NOW - timedelta(seconds=age), NOW + timedelta(hours=1))
        await conn.execute("UPDATE ledgers SET cpu_reserved = cpu_reserved + $2 "
                           "WHERE pool_id = $1", pool_id, cpu * len(ages_seconds))


async def _busy_pool(db: Database, pool_id: str = "p1", *, cpu: int = 4000) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, pool_id, tenants=["t-a"], capacity=(cpu, 8192, 0))
        await conn.execute("INSERT INTO runtime_instances (id, last_heartbeat_at) "
                           "VALUES ($1, $2)", f"rt-{pool_id}", NOW)


@pytest.mark.parametrize("policy", ["fifo", "priority", "fair"])
async def test_an_eta_is_given_when_capacity_is_the_only_blocker_and_completions_are_seen(
    db: Database, policy: str,
) -> None:
    await _busy_pool(db, cpu=1000)
    await _live(db, "p1", [400, 300], cpu=500)
    async with db.transaction() as conn:
        first, second = await tasks_add(conn, tenant="t-a", count=2, spec=spec_make(cpu=500))
    await _park(db)
    # Three leases on the candidate pool completed in the window, one long before it.
    await _completed(db, "p1", [60, 300, 600, 5000])
    queue = await _read(db, second, _settings(policy))
    assert queue["position"] == 2
    # 3 completions in 900 s: one every 300 s. The first lease to end makes room for the
    # task ahead, the second for this one: 600 s from now.
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=600)
    assert queue["estimate"] == (
        "about 10 minutes: the planner places it on pool p1 once the 2 oldest live leases on "
        "its 1 candidate pool have ended, after the 1 task ahead of it; leases on its 1 "
        "candidate pool completed at 0.2 per minute over the last 15 minutes, one about "
        "every 5 minutes"
    )


async def test_no_eta_when_no_completion_was_observed(db: Database) -> None:
    await _busy_pool(db, cpu=1000)
    await _live(db, "p1", [400], cpu=1000)
    async with db.transaction() as conn:
        (task,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=500))
    await _park(db)
    await _completed(db, "p1", [5000])  # outside the window
    queue = await _read(db, task, _settings())
    assert queue["estimatedStartAt"] is None
    assert queue["estimate"] == (
        "no estimate: the planner places it on pool p1 once the oldest live lease on its 1 "
        "candidate pool has ended, but no lease on its 1 candidate pool completed over the "
        "last 15 minutes"
    )


async def test_a_big_task_behind_small_ones_waits_for_the_room_the_planner_leaves_it(
    db: Database,
) -> None:
    # Eight leases of 500m fill the pool; the oldest ends first.
    await _busy_pool(db)
    await _live(db, "p1", [800, 700, 600, 500, 400, 300, 200, 100], cpu=500)
    async with db.transaction() as conn:
        small = await tasks_add(conn, tenant="t-a", count=2, spec=spec_make(cpu=500),
                                admitted_at=NOW - timedelta(seconds=60))
        (big,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=2000))
    await _park(db)
    await _completed(db, "p1", [100, 400, 700])  # one every 300 s
    queue = await _read(db, big, _settings())
    # position / rate would say 3 x 300 s. The planner places the two small tasks first
    # (one lease each), then needs four more leases to end for 2000m: six, 1800 s.
    assert queue["position"] == 3
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=1800)
    assert "once the 6 oldest live leases on its 1 candidate pool have ended, after the 2 " \
        "tasks ahead of it" in queue["estimate"]
    # The planner's order: the small tasks start at the first and second lease ends.
    for n, task in enumerate(small, 1):
        assert (await _read(db, task, _settings()))["estimatedStartAt"] == NOW + timedelta(
            seconds=300 * n)
    # Under the priority policy the big task goes first when it ranks higher.
    async with db.transaction() as conn:
        await conn.execute("UPDATE tasks SET priority = 9 WHERE id = $1", big)
    queue = await _read(db, big, _settings("priority"))
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=1200)
    assert "after the 0 tasks ahead of it" in queue["estimate"]


async def test_a_task_that_fits_now_starts_at_the_next_pass(db: Database) -> None:
    await _busy_pool(db, "p1", cpu=1000)
    await _live(db, "p1", [100], cpu=1000)
    await _busy_pool(db, "p2", cpu=1000)
    await _live(db, "p2", [100], cpu=1000)
    async with db.transaction() as conn:
        (task,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=500))
    # Not examined yet: the next pass will say.
    queue = await _read(db, task, _settings())
    assert queue["estimate"].startswith("no estimate: not examined yet")
    await _park(db)
    # p2's lease has ended since the pass parked it: the planner places it there now.
    async with db.transaction() as conn:
        await conn.execute("DELETE FROM reservations WHERE pool_id = 'p2'")
        await conn.execute("UPDATE leases SET state = 'COMPLETED', ended_at = $1 "
                           "WHERE pool_id = 'p2'", NOW)
        await conn.execute("UPDATE ledgers SET cpu_reserved = 0 WHERE pool_id = 'p2'")
    queue = await _read(db, task, _settings(tick_seconds=5.0))
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=5)
    assert queue["estimate"] == (
        "at the next pass (passes run at least every 5 seconds): the planner places it on "
        "pool p2 now, after the 0 tasks ahead of it")


async def test_a_task_only_a_long_leased_pool_fits_starts_after_those_leases_end(
    db: Database,
) -> None:
    # p-small can never hold 3000m; p-big can, once both of its long leases end. Leases on
    # p-small end often, but they cannot make room for it.
    await _busy_pool(db, "p-big", cpu=4000)
    await _busy_pool(db, "p-small", cpu=1000)
    await _live(db, "p-big", [7200, 3600], cpu=2000)
    await _live(db, "p-small", [10, 20, 30, 40], cpu=250)
    async with db.transaction() as conn:
        (task,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=3000))
    await _park(db)
    await _completed(db, "p-big", [100, 500, 850])
    await _completed(db, "p-small", [5, 6, 7, 8, 9, 11, 12])
    queue = await _read(db, task, _settings())
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=600)
    assert queue["estimate"].startswith(
        "about 10 minutes: the planner places it on pool p-big once the 2 oldest live leases "
        "on its 1 candidate pool have ended")
    # Past the bound on the leases let end, no estimate, and why.
    queue = await _read(db, task, _settings(eta_leases_max=1))
    assert queue["estimatedStartAt"] is None
    assert queue["estimate"] == (
        "no estimate: the planner does not place it even once the oldest live lease on its 1 "
        "candidate pool has ended (the most an estimate lets end, BERTH_ETA_LEASES_MAX)")


async def test_past_the_tasks_bound_there_is_no_estimate(db: Database) -> None:
    await _busy_pool(db, cpu=1000)
    await _live(db, "p1", [100], cpu=1000)
    async with db.transaction() as conn:
        ids = await tasks_add(conn, tenant="t-a", count=3, spec=spec_make(cpu=500))
    await _park(db)
    queue = await _read(db, ids[2], _settings(eta_tasks_max=2))
    assert (queue["estimatedStartAt"], queue["estimate"]) == (None, (
        "no estimate: more than 2 tasks are ahead of it, the most an estimate plans "
        "(BERTH_ETA_TASKS_MAX)"))
    assert (await _read(db, ids[1], _settings(eta_tasks_max=2)))["estimate"].startswith(
        "no estimate: the planner places it on pool p1")


async def _pending_as(db: Database, task_id: uuid.UUID, reason: dict) -> None:
    """Give ``task_id`` the pending reason a pass writes for a waiting preemptor, reclaimer
    or nominee: parked at the capacity stage, with no wake keys (its holds unpark it)."""
    async with db.transaction() as conn:
        await conn.execute(
            "UPDATE tasks SET pending_reason = $2::jsonb, pending_stage = $3, parked = true, "
            "wake = '{}' WHERE id = $1", task_id, reason, int(Stage.CAPACITY))


@pytest.mark.parametrize("code", ["preempting", "reclaiming"])
async def test_a_task_waiting_for_victims_starts_by_their_deadline_at_the_latest(
    db: Database, code: str,
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t-a"], capacity=(1000, 1000, 0),
                       reserved=(1000, 0, 0))
        (task,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=500))
    await _pending_as(db, task, {"code": code, "message": "m", "rejections": {},
                                 "victims": 2, "revokeBy": "2026-11-29T12:00:30Z"})
    queue = await _read(db, task, _settings())
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=30)
    assert queue["estimate"] == (
        "by 2026-11-29T12:00:30Z at the latest: the 2 leases it takes capacity from must "
        "stop by then (it starts as soon as they do)"
    )


async def test_a_nominee_is_estimated_from_leases_ending_on_its_nominated_pools(
    db: Database,
) -> None:
    await _busy_pool(db, "p1")
    await _busy_pool(db, "p2")
    # p1: three leases and 1000m already held for the nominee; p2: younger leases only.
    await _live(db, "p1", [400, 300, 200], cpu=1000)
    await _live(db, "p2", [10, 20, 30, 40], cpu=1000)
    async with db.transaction() as conn:
        (task,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=4000))
        await conn.execute("INSERT INTO reservations (task_id, pool_id, cpu, memory, llm, hold) "
                           "VALUES ($1, 'p1', 1000, 0, 0, true)", task)
        await conn.execute("UPDATE ledgers SET cpu_reserved = 4000 WHERE pool_id = 'p1'")
    await _pending_as(db, task, {
        "code": "nominated", "message": "m", "rejections": {}, "poolIds": ["p1"],
        "need": {"cpuMillis": 4000, "memoryMiB": 0, "llmSlots": 0},
        "held": {"cpuMillis": 1000, "memoryMiB": 0, "llmSlots": 0},
        "nominatedAt": "2026-11-29T11:59:00Z"})
    # Completions on p2 do not help it: its nominated pool is p1.
    await _completed(db, "p1", [60, 300, 600])
    await _completed(db, "p2", [10, 20, 30, 40, 50, 70])
    queue = await _read(db, task, _settings())
    # With its hold, p1's three leases ending make room: 3 x 300 s.
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=900)
    assert queue["estimate"] == (
        "about 15 minutes: the planner places it on pool p1 once the 3 oldest live leases on "
        "its 1 nominated pool (their freed capacity is held for it) have ended, after the 0 "
        "tasks ahead of it; leases on its 1 nominated pool (their freed capacity is held for "
        "it) completed at 0.2 per minute over the last 15 minutes, one about every 5 minutes"
    )


@pytest.mark.parametrize(("spec", "estimate"), [
    (spec_make(cpu=8000),
     "no pool can ever fit: largest cpu total is 4000, request is 8000"),
    (spec_make(runtime_class="gpu"),
     "no estimate: no pool can take it until a pool is added, activated or changed "
     "(0/1 pool fits: 1 runs another runtime class (closest))"),
    (spec_make(labels={"app": "web"}, affinity={"required": [
        {"selector": {"app": "db"}, "topology": "pool"}]}),
     "no estimate: capacity is not the only blocker (it waits for a task it requires "
     "affinity with)"),
], ids=["never-fits", "runtime-class", "affinity"])
async def test_no_eta_with_the_reason_why(db: Database, spec: dict, estimate: str) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t-a"], capacity=(4000, 8192, 0))
        await conn.execute("INSERT INTO runtime_instances (id, last_heartbeat_at) "
                           "VALUES ('rt-p1', $1)", NOW)
        (task,) = await tasks_add(conn, tenant="t-a", spec=spec)
    await _park(db)
    await _completed(db, "p1", [60])
    queue = await _read(db, task, _settings())
    assert (queue["estimatedStartAt"], queue["estimate"]) == (None, estimate)


@pytest.mark.parametrize("policy", ["fifo", "priority", "fair"])
async def test_tasks_of_tenants_that_share_no_pool_with_the_caller_do_not_count(
    db: Database, policy: str
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "acme-only", tenants=["acme"])
        await pool_add(conn, "globex-only", tenants=["globex"])
        await pool_add(conn, "shared", tenants=["globex", "initech"])
        # Older than acme's task and of higher priority: ahead of it under every policy,
        # were they competing for the same pools.
        await tasks_add(conn, tenant="globex", count=37, spec=spec_make(priority=5),
                        admitted_at=NOW - timedelta(seconds=600))
        (initech,) = await tasks_add(conn, tenant="initech", spec=spec_make(),
                                     admitted_at=NOW - timedelta(seconds=300))
        (acme,) = await tasks_add(conn, tenant="acme", spec=spec_make(), admitted_at=NOW)
    settings = _settings(policy)
    queue = await _read(db, acme, settings)
    assert (queue["position"], queue["competing"], queue["exact"]) == (1, 1, True)
    # initech shares a pool with globex: globex's tasks compete with it.
    queue = await _read(db, initech, settings)
    assert queue["competing"] == 38
    assert queue["position"] == (2 if policy == "fair" else 38)


async def test_an_estimate_counts_no_work_of_tenants_that_share_no_pool(db: Database) -> None:
    async with db.transaction() as conn:
        for pool, tenant in (("acme-p", "acme"), ("globex-p", "globex")):
            await pool_add(conn, pool, tenants=[tenant], capacity=(1000, 8192, 0))
            await conn.execute("INSERT INTO runtime_instances (id, last_heartbeat_at) "
                               "VALUES ($1, $2)", f"rt-{pool}", NOW)
    await _live(db, "acme-p", [100], cpu=1000, tenant="acme")
    await _live(db, "globex-p", [100], cpu=1000, tenant="globex")
    async with db.transaction() as conn:
        await tasks_add(conn, tenant="globex", count=2, spec=spec_make(cpu=500),
                        admitted_at=NOW - timedelta(seconds=600))
        (acme,) = await tasks_add(conn, tenant="acme", spec=spec_make(cpu=500))
    await _park(db)
    await _completed(db, "acme-p", [100, 400, 700])
    # globex's pool frees up: the planner places globex's two older tasks there, in the same
    # plan that places acme's task once its own pool's lease ends.
    async with db.transaction() as conn:
        await conn.execute("DELETE FROM reservations WHERE pool_id = 'globex-p'")
        await conn.execute("UPDATE leases SET state = 'COMPLETED', ended_at = $1 "
                           "WHERE pool_id = 'globex-p'", NOW)
        await conn.execute("UPDATE ledgers SET cpu_reserved = 0 WHERE pool_id = 'globex-p'")
    queue = await _read(db, acme, _settings())
    assert queue["estimatedStartAt"] == NOW + timedelta(seconds=300)
    assert "after the 0 tasks ahead of it" in queue["estimate"]
    assert "globex" not in queue["estimate"]


async def test_a_task_that_can_never_fit_says_so_and_counts_for_no_position(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t-a"], capacity=(4000, 8192, 0),
                       reserved=(4000, 0, 0))
        await pool_add(conn, "p2", tenants=["t-a"], capacity=(4000, 8192, 0),
                       reserved=(4000, 0, 0))
        await conn.execute("INSERT INTO runtime_instances (id, last_heartbeat_at) "
                           "VALUES ('rt-p1', $1), ('rt-p2', $1)", NOW)
        (huge,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=8000),
                                  admitted_at=NOW - timedelta(seconds=60))
        (small,) = await tasks_add(conn, tenant="t-a", spec=spec_make(cpu=1000),
                                   admitted_at=NOW)
        (elsewhere,) = await tasks_add(conn, tenant="t-a",
                                       spec=spec_make(runtime_class="gpu"), admitted_at=NOW)
    await _park(db)
    async with db.connection() as conn:
        row = await task_get(conn, task_id=huge, tenant_ids=["t-a"])
    assert row.pending_reason["code"] == "never_fits"
    assert row.pending_reason["message"].startswith("never fits, no pool is large enough")
    assert "2 have less cpu in total than it requests" in row.pending_reason["message"]
    queue = await _read(db, huge, _settings())
    assert queue["position"] is None
    assert queue["estimate"] == "no pool can ever fit: largest cpu total is 4000, request is 8000"
    # The older task that can never fit is not ahead of the one that waits for capacity.
    queue = await _read(db, small, _settings())
    assert (queue["position"], queue["competing"]) == (1, 1)
    # A task of a class no pool runs is in no one's queue, its own included.
    queue = await _read(db, elsewhere, _settings())
    assert queue["position"] is None
    assert queue["estimate"].startswith("no estimate: no pool can take it until a pool is added")
