"""Recorded passes: each committed pass stores its inputs and decisions, and replays to the
same decisions; retention prunes them."""

from __future__ import annotations

from datetime import timedelta

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.pass_records import pass_records_read
from app.reconciler import Reconciler, ReconcilerConfig
from app.services.replays import ReplayWindow, replay_run
from tests.factories import NOW, heartbeat_add, pool_add, spec_make, tasks_add

ALL = frozenset(range(SHARD_SLOTS))


def reconciler(db: Database, name: str = "rec", **config: object) -> Reconciler:
    return Reconciler(db, ReconcilerConfig(**config), owner_id=name, slots=ALL)


async def _world(db: Database, tenant: str = "t1") -> list:
    async with db.transaction() as conn:
        for i, cap in enumerate([(2000, 4096, 0), (3000, 4096, 0), (1000, 2048, 0)]):
            await pool_add(conn, f"{tenant}-p{i}", tenants=[tenant], capacity=cap)
            await heartbeat_add(conn, f"rt-{tenant}-p{i}", at=NOW)
        return await tasks_add(conn, tenant=tenant, count=12, spec=spec_make(cpu=500))


async def _records(db: Database, pass_id_prefix: str) -> list:
    async with db.connection() as conn:
        rows = await pass_records_read(conn, after_id=0, limit=1000)
    return [r for r in rows if r.pass_id.startswith(pass_id_prefix)]


async def test_a_committed_pass_is_recorded_and_replays_identically(db: Database) -> None:
    await _world(db)
    result = await reconciler(db, "rec-a").run_once(now=NOW)
    assert result.leased == 12 and result.recorded_bytes > 0
    (record,) = await _records(db, "rec-a/")
    assert record.recorded_at == NOW
    answer = await replay_run(db, window=ReplayWindow(pass_ids=[record.pass_id]),
                              profile=None, now=NOW)
    assert (answer["passes"], answer["decisions"], answer["identical"]) == (1, 12, 12)
    assert answer["changed"] == [] and answer["summary"]["plansIdentical"] == 1


async def test_no_record_without_retention(db: Database) -> None:
    await _world(db)
    result = await reconciler(db, "rec-off", pass_records_seconds=0).run_once(now=NOW)
    assert result.leased == 12 and result.recorded_bytes == 0
    assert await _records(db, "rec-off/") == []


async def test_records_past_the_retention_are_pruned(db: Database) -> None:
    # Long before the other tests' passes: pruning this one's leaves theirs alone.
    then = NOW - timedelta(days=400)
    await _world(db, tenant="pruned")
    r = reconciler(db, "rec-prune", pass_records_seconds=60)
    await r.run_once(now=then)
    (record,) = await _records(db, "rec-prune/")
    assert await r.records_prune_once(now=then + timedelta(seconds=30)) == 0
    assert await r.records_prune_once(now=then + timedelta(seconds=61)) == 1
    assert await _records(db, "rec-prune/") == []
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM pass_record_pools WHERE digest = $1",
                                   record.pools_digest) == 0
