"""Retention: the leader deletes finished tasks older than the retention, with their events and
leases, in batches; queued and leased tasks, recent history and the ledger are untouched."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from pydantic import ValidationError

from app.cli import main as cli_main
from app.config import SHARD_SLOTS, Settings
from app.db import Database
from app.ledger.leases import lease_complete, runtime_heartbeat, task_cancel
from app.ledger.tasks import task_get as ledger_task_get
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, ledger_violations, pool_add, spec_make, tasks_add

ALL = frozenset(range(SHARD_SLOTS))
RETENTION = timedelta(days=7)


def reconciler(db: Database, name: str = "r", **config: object) -> Reconciler:
    config.setdefault("finished_retention_seconds", RETENTION.total_seconds())
    cfg = ReconcilerConfig(**config)  # type: ignore[arg-type]
    return Reconciler(db, cfg, owner_id=name, slots=ALL)


async def _lease_of(db: Database, task_id: uuid.UUID) -> tuple[uuid.UUID, int]:
    async with db.connection() as conn:
        row = await conn.fetchrow("SELECT id, epoch FROM leases WHERE task_id = $1", task_id)
    return row[0], int(row[1])


async def _history(db: Database) -> dict[uuid.UUID, tuple[str, int, int]]:
    """Return (state, events, leases) per task."""
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT t.id, t.state, "
            "(SELECT count(*) FROM task_events e WHERE e.task_id = t.id), "
            "(SELECT count(*) FROM leases l WHERE l.task_id = t.id) FROM tasks t"
        )
        orphans = await conn.fetchval(
            "SELECT (SELECT count(*) FROM task_events e WHERE NOT EXISTS "
            "(SELECT 1 FROM tasks t WHERE t.id = e.task_id)) + (SELECT count(*) FROM leases l "
            "WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = l.task_id))"
        )
    assert orphans == 0
    return {r[0]: (r[1], int(r[2]), int(r[3])) for r in rows}


async def _lifecycle(db: Database) -> dict[str, uuid.UUID]:
    """Leave, as the real lifecycle does: two tasks succeeded and one failed at NOW, one
    cancelled while queued at NOW, one succeeded 6 days later, one leased, one queued."""
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(6000, 8192, 0))
        await runtime_heartbeat(conn, instance_id="rt-p1", now=NOW, lease_ttl_seconds=10**7)
        ids = await tasks_add(conn, tenant="t1", count=6, spec=spec_make(cpu=1000))
    assert (await reconciler(db).run_once(now=NOW)).leased == 6
    names = ["ok1", "ok2", "failed", "recent", "leased", "queued"]
    task = dict(zip(names, ids, strict=True))
    for name, outcome, at in (("ok1", "succeeded", NOW), ("ok2", "succeeded", NOW),
                              ("failed", "failed", NOW),
                              ("recent", "succeeded", NOW + timedelta(days=6))):
        lease_id, epoch = await _lease_of(db, task[name])
        async with db.transaction() as conn:
            await lease_complete(conn, lease_id=lease_id, epoch=epoch, outcome=outcome,
                                 message=None, now=at)
    async with db.transaction() as conn:
        # "queued" goes back to the queue (as after a lost lease) and stays there; an old
        # cancelled-while-queued task has no lease at all.
        await conn.execute("UPDATE leases SET state = 'EXPIRED', ended_at = $2 "
                           "WHERE task_id = $1", task["queued"], NOW)
        await conn.execute("DELETE FROM reservations WHERE task_id = $1", task["queued"])
        await conn.execute("UPDATE ledgers SET cpu_reserved = cpu_reserved - 1000")
        await conn.execute("UPDATE tasks SET state = 'ADMITTED', placement = NULL, "
                           "leased_at = NULL, admitted_at = $2 WHERE id = $1",
                           task["queued"], NOW - timedelta(days=30))
        (task["cancelled"],) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=1000))
        assert await task_cancel(conn, task_id=task["cancelled"], tenant_id="t1",
                                 now=NOW) == "CANCELLED"
    assert await ledger_violations(db) == []
    return task


async def test_finished_tasks_past_the_retention_go_whole_and_nothing_else(
    db: Database,
) -> None:
    task = await _lifecycle(db)
    before = await _history(db)
    assert before[task["ok1"]] == ("SUCCEEDED", 2, 1)  # leased, completed (claims write none)
    assert before[task["cancelled"]][0] == "CANCELLED"
    pruner = reconciler(db, sweep_batch=2, sweep_batches_max=1)
    try:
        # Within the retention nothing goes.
        assert await pruner.prune_once(now=NOW + RETENTION - timedelta(minutes=1)) == 0
        assert await _history(db) == before
        # Past it: the four finished at NOW, oldest first, two per batch, one batch a round.
        later = NOW + RETENTION + timedelta(minutes=1)
        assert await pruner.prune_once(now=later) == 2
        assert await pruner.prune_once(now=later) == 2
        assert await pruner.prune_once(now=later) == 0
    finally:
        await pruner.close()
    after = await _history(db)
    gone = {task[n] for n in ("ok1", "ok2", "failed", "cancelled")}
    assert set(after) == set(before) - gone
    # What is kept is kept whole: the recent finished task, the leased one and the queued
    # one (admitted 30 days ago, with an expired lease) keep their events and leases.
    assert all(after[t] == before[t] for t in after)
    assert after[task["leased"]][0] == "LEASED" and after[task["queued"]][0] == "ADMITTED"
    assert await ledger_violations(db) == []
    async with db.connection() as conn:
        assert await ledger_task_get(conn, task_id=task["recent"], tenant_ids=["t1"]) is not None
        assert await ledger_task_get(conn, task_id=task["ok1"], tenant_ids=["t1"]) is None


async def test_only_the_leader_prunes_and_zero_keeps_history(db: Database) -> None:
    task = await _lifecycle(db)
    later = NOW + timedelta(days=365)
    keeper = reconciler(db, "k", finished_retention_seconds=0.0)
    first, second = reconciler(db, "a"), reconciler(db, "b")
    try:
        assert await keeper.prune_once(now=later) == 0
        assert await first.ownership.leader()
        assert not await second.ownership.leader()
        assert await second.prune_once(now=later) == 0
        assert len(await _history(db)) == 7
        # The recent one is past the retention a year later too.
        assert await first.prune_once(now=later) == 5
    finally:
        await keeper.close()
        await first.close()
        await second.close()
    assert set(await _history(db)) == {task["leased"], task["queued"]}
    assert await ledger_violations(db) == []


def test_the_retention_setting_is_checked_and_reaches_the_reconciler() -> None:
    assert Settings().finished_task_retention_hours == 168
    assert ReconcilerConfig.from_settings(
        Settings(finished_task_retention_hours=48)
    ).finished_retention_seconds == 48 * 3600
    assert Settings(finished_task_retention_hours=0).finished_task_retention_hours == 0
    # Shorter than the idempotency window: a keyed resubmission could make a duplicate.
    with pytest.raises(ValidationError, match="IDEMPOTENCY_RETENTION_HOURS"):
        Settings(finished_task_retention_hours=2)
    assert Settings(finished_task_retention_hours=2,
                    idempotency_retention_hours=1).finished_task_retention_hours == 2
    with pytest.raises(ValidationError):
        Settings(finished_task_retention_hours=-1)


def test_a_bad_retention_is_one_line_and_exit_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BERTH_FINISHED_TASK_RETENTION_HOURS", "3")
    assert cli_main(["reconcile"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("berth: bad configuration BERTH_FINISHED_TASK_RETENTION_HOURS: ")
