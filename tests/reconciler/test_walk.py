"""Lost reservation races: the pass re-reads the pool and walks to the next ranked candidate.

A rival transaction on its own connection lowers a pool's total between the pass's snapshot
and its commit (an operator shrinking capacity concurrently), so the conditional ledger
update loses deterministically. The walk module itself is tested purely at the end.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import orjson

from app.config import SHARD_SLOTS
from app.db import Database
from app.dburl import database_url_parse
from app.ledger.claims import ClaimedTask
from app.ledger.snapshot import LedgerRow
from app.reconciler import Reconciler, ReconcilerConfig
from app.reconciler.passes import PassContext, pass_run
from app.reconciler.walk import Decision, decisions_walk
from app.scheduling.explain import placement_document
from app.scheduling.framework import select
from tests.factories import (
    NOW,
    heartbeat_add,
    ledger_violations,
    pool_add,
    rival_clock,
    spec_make,
    task_get,
    tasks_add,
)
from tests.scheduling.factories import pool as core_pool
from tests.scheduling.factories import snapshot as core_snapshot
from tests.scheduling.factories import spec as core_spec

ALL = frozenset(range(SHARD_SLOTS))


async def _run(db: Database, database_url: str, sql: str, **config: object):
    ctx = PassContext(
        db=db, config=ReconcilerConfig(**config), slots=ALL,
        rng=lambda: 0.0, sleep=asyncio.sleep, clock=rival_clock(database_url, sql),
    )
    return await pass_run(ctx, pass_id="walker/1", now=NOW)


async def _pools(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(2000, 1000, 0))
        await pool_add(conn, "p2", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        await heartbeat_add(conn, "rt-p2", at=NOW)


async def test_lost_race_walks_to_the_next_candidate(db: Database, database_url: str) -> None:
    await _pools(db)
    async with db.transaction() as conn:
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=500))
    result = await _run(db, database_url, "UPDATE ledgers SET cpu_total = 300 WHERE pool_id = 'p1'")
    assert (result.leased, result.conflicts, result.walked) == (1, 1, 1)
    assert result.commit_rounds == 2
    async with db.connection() as conn:
        task = await task_get(conn, task_id)
        reserved = {r[0]: r[1] for r in await conn.fetch(
            "SELECT pool_id, cpu_reserved FROM ledgers")}
    assert task["placement"]["poolId"] == "p2"
    assert task["walked_from"] == ["p1"]
    assert reserved == {"p1": 0, "p2": 500}
    assert await ledger_violations(db) == []


async def test_past_the_walk_limit_the_task_is_requeued_unparked(
    db: Database, database_url: str
) -> None:
    await _pools(db)
    async with db.transaction() as conn:
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=500))
    result = await _run(db, database_url,
                        "UPDATE ledgers SET cpu_total = 300 WHERE pool_id = 'p1'",
                        reservation_walk_limit=0)
    assert (result.leased, result.requeued, result.conflicts) == (0, 1, 1)
    async with db.connection() as conn:
        task = await task_get(conn, task_id)
        reason = await conn.fetchval(
            "SELECT reason FROM task_events WHERE task_id = $1 ORDER BY id DESC LIMIT 1", task_id)
    assert (task["state"], task["parked"]) == ("ADMITTED", False)  # retried next pass
    assert reason == "reservation_conflict"
    again = await Reconciler(db, ReconcilerConfig(), owner_id="next", slots=ALL).run_once(now=NOW)
    assert again.leased == 1
    assert await ledger_violations(db) == []


async def test_a_gang_that_loses_a_member_race_reserves_nothing(
    db: Database, database_url: str
) -> None:
    await _pools(db)
    async with db.transaction() as conn:
        (gang,) = await tasks_add(conn, tenant="t1", spec=spec_make(
            cpu=500, gang={"members": 2, "minPools": 2}))
        (single,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=100))
    result = await _run(db, database_url,
                        "UPDATE ledgers SET cpu_total = 400 WHERE pool_id = 'p2'")
    assert result.requeued == 1
    async with db.connection() as conn:
        assert (await task_get(conn, gang))["state"] == "ADMITTED"
        assert (await task_get(conn, single))["state"] == "LEASED"
        gang_rows = await conn.fetchval(
            "SELECT count(*) FROM reservations WHERE task_id = $1", gang)
    assert gang_rows == 0
    assert await ledger_violations(db) == []


async def test_a_pass_whose_last_reserving_round_loses_hands_everything_back(
    db: Database, database_url: str
) -> None:
    await _pools(db)
    async with db.transaction() as conn:
        (task_id,) = await tasks_add(conn, tenant="t1", spec=spec_make(cpu=500))
    result = await _run(db, database_url,
                        "UPDATE ledgers SET cpu_total = 300 WHERE pool_id = 'p1'",
                        commit_rounds_max=1)
    # Round 1 reserved and lost; it was the last: the task is handed back in the same
    # transaction, its lease undone.
    assert (result.commit_rounds, result.conflicts, result.walked) == (1, 1, 0)
    assert (result.leased, result.requeued, result.lost) == (0, 1, 0)
    async with db.connection() as conn:
        task = await task_get(conn, task_id)
        reserved = await conn.fetchval("SELECT SUM(cpu_reserved) FROM ledgers")
    assert (task["state"], task["parked"]) == ("ADMITTED", False)
    assert reserved == 0
    assert await ledger_violations(db) == []


# --- the walk itself, pure ----------------------------------------------------------------


def _decision(snap, task_spec, *, n: int = 0):
    """Return the core's decision for ``task_spec`` on ``snap`` (top 4 candidates)."""
    outcome = select(task_spec, snap, top_k=4)
    assert outcome.placement is not None
    task = ClaimedTask(uuid.UUID(int=n + 1), "acme", n, 0, "{}", NOW, 0)
    return Decision(task, task_spec, outcome, outcome.placement.members)


def _three_pools():
    # Spread ranks the emptiest pool first: a, then b, then c.
    return core_snapshot([
        core_pool("a", capacity=(4000, 8192, 0)),
        core_pool("b", capacity=(4000, 8192, 0), reserved=(1000, 0, 0)),
        core_pool("c", capacity=(4000, 8192, 0), reserved=(2000, 0, 0)),
    ])


def walked_from(d: Decision) -> list[str]:
    """Return the pools the stored placement of ``d`` walked past."""
    return orjson.loads(d.placement_text())[5]


def test_a_decision_that_still_fits_the_fresh_ledger_stays() -> None:
    snap = _three_pools()
    d = _decision(snap, core_spec())
    assert d.members == (("a", 1),)
    fresh = {"a": LedgerRow((4000, 8192, 0), (3000, 0, 0))}  # someone took 3000 of 4000
    kept, released = decisions_walk([d], fresh=fresh, snapshot=snap, walk_limit=3)
    assert (kept, released) == ([d], [])
    assert (d.walks, d.cursor) == (0, 0)
    assert walked_from(d) == []


def test_a_decision_that_no_longer_fits_walks_to_the_next_candidate() -> None:
    snap = _three_pools()
    d = _decision(snap, core_spec())
    fresh = {"a": LedgerRow((4000, 8192, 0), (3500, 0, 0))}
    kept, released = decisions_walk([d], fresh=fresh, snapshot=snap, walk_limit=3)
    assert (kept, released) == ([d], [])
    assert d.members == (("b", 1),) and (d.walks, d.cursor) == (1, 1)
    placement = placement_document(d.placement_text())
    assert placement["poolId"] == "b"
    assert walked_from(d) == ["a"]
    assert placement["members"] == [{"poolId": "b", "count": 1}]
    assert [c["poolId"] for c in placement["alternatives"]] == ["c"]


def test_the_walk_limit_counts_per_task_over_the_pass() -> None:
    snap = _three_pools()
    d = _decision(snap, core_spec())
    full = {p: LedgerRow((4000, 8192, 0), (4000, 0, 0)) for p in ("a", "b")}
    kept, released = decisions_walk([d], fresh=full, snapshot=snap, walk_limit=1)
    assert (kept, released) == ([], [d])  # b was full too, and one walk was all it had
    assert d.walks == 1

    again = _decision(snap, core_spec())
    kept, _ = decisions_walk([again], fresh=full, snapshot=snap, walk_limit=2)
    assert kept == [again] and again.members == (("c", 1),) and again.walks == 2
    # A later lost race cannot walk it further: its two walks are spent.
    c_full = {"c": LedgerRow((4000, 8192, 0), (4000, 0, 0))}
    kept, released = decisions_walk([again], fresh=c_full, snapshot=snap, walk_limit=2)
    assert (kept, released) == ([], [again])


def test_no_walk_allowed_releases_at_once() -> None:
    snap = _three_pools()
    d = _decision(snap, core_spec())
    fresh = {"a": LedgerRow((4000, 8192, 0), (4000, 0, 0))}
    assert decisions_walk([d], fresh=fresh, snapshot=snap, walk_limit=0) == ([], [d])
    assert d.walks == 0 and d.members == (("a", 1),)


def test_a_gang_never_walks() -> None:
    snap = _three_pools()
    d = _decision(snap, core_spec(gang={"members": 2, "minPools": 2}))
    pools = [p for p, _ in d.members]
    fresh = {pools[0]: LedgerRow((4000, 8192, 0), (4000, 0, 0))}
    kept, released = decisions_walk([d], fresh=fresh, snapshot=snap, walk_limit=3)
    assert (kept, released) == ([], [d])
    assert d.walks == 0 and [p for p, _ in d.members] == pools


def test_earlier_decisions_in_policy_order_take_the_room_first() -> None:
    snap = _three_pools()
    first, second = _decision(snap, core_spec(), n=0), _decision(snap, core_spec(), n=1)
    fresh = {"a": LedgerRow((4000, 8192, 0), (2500, 0, 0))}  # room for one more on a
    kept, released = decisions_walk([first, second], fresh=fresh, snapshot=snap, walk_limit=3)
    assert (kept, released) == ([first, second], [])
    assert first.members == (("a", 1),) and first.walks == 0
    assert second.members == (("b", 1),) and second.walks == 1


def test_out_of_candidates_is_released() -> None:
    snap = core_snapshot([core_pool("a", capacity=(1000, 8192, 0))])
    d = _decision(snap, core_spec())
    fresh = {"a": LedgerRow((1000, 8192, 0), (1000, 0, 0))}
    assert decisions_walk([d], fresh=fresh, snapshot=snap, walk_limit=3) == ([], [d])


async def test_a_later_round_skips_a_pool_another_transaction_holds(
    db: Database, database_url: str
) -> None:
    """Round 1 waits for ledger rows in pool-id order; later rounds of the same pass hold rows
    already, so they never wait: a row held elsewhere refuses, and the task walks on."""
    async with db.transaction() as conn:
        for pool in ("p1", "p2", "p3"):
            await pool_add(conn, pool, tenants=["t1"], capacity=(4000, 4000, 0))
            await heartbeat_add(conn, f"rt-{pool}", at=NOW)
        first, second = await tasks_add(conn, tenant="t1", count=2, spec=spec_make(cpu=1000))
    holder = await asyncpg.connect(database_url_parse(database_url).dsn)
    try:
        async with holder.transaction():
            # Another transaction holds every ledger row but those the pass placed on first.
            plan = await _run_dry(db)
            taken = {plan[first], plan[second]}
            others = sorted({"p1", "p2", "p3"} - taken)
            await holder.execute(
                "SELECT 1 FROM ledgers WHERE pool_id = ANY($1::text[]) FOR UPDATE", others)
            # The rival shrinks the second task's pool at the pass's commit.
            result = await _run(db, database_url,
                                f"UPDATE ledgers SET cpu_total = 500 "
                                f"WHERE pool_id = '{plan[second]}'")
    finally:
        await holder.close()
    assert (result.leased, result.requeued) == (2, 0)
    async with db.connection() as conn:
        moved = await task_get(conn, second)
        stayed = await task_get(conn, first)
    # Refused by the shrunk pool, then by the held one; placed where the first task is.
    assert moved["placement"]["poolId"] == plan[first]
    assert moved["walked_from"][0] == plan[second]
    assert stayed["placement"]["poolId"] == plan[first]
    assert result.commit_rounds >= 3
    assert await ledger_violations(db) == []


async def _run_dry(db: Database) -> dict:
    """Return where a pass would place each task now (in a transaction rolled back)."""
    from app.reconciler.passes import _pass_in

    ctx = PassContext(db=db, config=ReconcilerConfig(), slots=ALL, rng=lambda: 0.0,
                      sleep=asyncio.sleep)
    async with db.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            await _pass_in(conn, ctx, pass_id="dry", now=NOW)
            rows = await conn.fetch("SELECT id, placement FROM tasks")
        finally:
            await tx.rollback()
    return {r[0]: placement_document(r[1])["poolId"] for r in rows if r[1] is not None}
