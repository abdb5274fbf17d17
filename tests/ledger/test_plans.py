"""``plan_apply`` and ``grants_settle``: a plan is written in the pass's transaction; a pool
that refuses undoes only the grants on it, and a later ledger statement never waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from app.config import SHARD_SLOTS
from app.db import Connection, Database
from app.ledger.claims import tasks_claim
from app.ledger.plans import Grant, Plan, Unclaim, grants_settle, plan_apply
from tests.factories import (
    NOW,
    ledger_violations,
    placement_on,
    pool_add,
    spec_make,
    task_get,
    tasks_add,
)

ALL = frozenset(range(SHARD_SLOTS))
REASON = {"code": "insufficient_cpu", "message": "no room", "rejections": {}}


async def _tasks(db: Database, count: int) -> list:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await pool_add(conn, "p2", tenants=["t1"], capacity=(1000, 1000, 0))
        return await tasks_add(conn, tenant="t1", count=count, spec=spec_make(cpu=400))


@asynccontextmanager
async def _pass(db: Database, count: int) -> AsyncIterator[tuple[Connection, list]]:
    """Yield a transaction holding ``count`` claimed tasks, and those tasks."""
    async with db.transaction() as conn:
        claimed = await tasks_claim(conn, slots=ALL, batch=count, now=NOW)
        yield conn, claimed


def _grant(task_id, pool_id: str, cpu: int = 400) -> Grant:
    return Grant(task_id, placement_on(pool_id), ((pool_id, 1, f"rt-{pool_id}"),), (cpu, 0, 0))


async def _written(db: Database) -> tuple:
    async with db.connection() as conn:
        return (
            await conn.fetchval("SELECT count(*) FROM reservations"),
            await conn.fetchval("SELECT count(*) FROM leases"),
            await conn.fetchval("SELECT SUM(cpu_reserved) FROM ledgers"),
            await conn.fetchval("SELECT count(*) FROM task_events"),
        )


async def test_a_plan_is_applied_whole(db: Database) -> None:
    a, b, c = await _tasks(db, 3)
    async with _pass(db, 3) as (conn, _):
        result = await plan_apply(conn, plan=Plan(
            grants=(_grant(a, "p1"), _grant(b, "p2")),
            unclaims=(Unclaim(c, "insufficient_cpu", REASON, parked=True),),
        ), now=NOW, lease_ttl_seconds=60)
    assert result.refused == frozenset() and result.lost_preemptions == frozenset()
    assert (set(result.leased), result.unclaimed) == ({a, b}, {c})
    # One event per task: leased, or the pending reason.
    assert await _written(db) == (2, 2, 800, 3)
    async with db.connection() as conn:
        lease = await conn.fetchrow("SELECT runtime_instance_id, epoch, expires_at "
                                    "FROM leases WHERE task_id = $1", a)
        assert (await task_get(conn, a))["placement"]["poolId"] == "p1"
        assert (await task_get(conn, c))["pending_reason"] == REASON
        events = await conn.fetch("SELECT from_state, to_state, reason FROM task_events "
                                  "WHERE task_id = $1", a)
    assert [tuple(e) for e in events] == [("ADMITTED", "LEASED", "leased")]
    assert tuple(lease) == ("rt-p1", 1, NOW + timedelta(seconds=60))
    assert await ledger_violations(db) == []


async def test_a_refused_pool_undoes_only_the_grants_on_it(db: Database) -> None:
    a, b, c = await _tasks(db, 3)
    async with db.connection() as conn:  # a rival got to p2 first
        await conn.execute("UPDATE ledgers SET cpu_reserved = 700 WHERE pool_id = 'p2'")
        await conn.execute("UPDATE tasks SET pending_reason = $2::jsonb, pending_stage = 4 "
                           "WHERE id = $1", b, REASON)
    async with _pass(db, 3) as (conn, claimed):
        result = await plan_apply(conn, plan=Plan(
            grants=(_grant(a, "p1"), _grant(b, "p2"), _grant(c, "p2", cpu=200)),
        ), now=NOW, lease_ttl_seconds=60)
        assert result.refused == {"p2"}
        by_id = {t.id: t for t in claimed}
        # b walks to p1; c (200) still fits p2 (700 reserved by the rival): it stays.
        leased, refused = await grants_settle(
            conn, undo=[by_id[b], by_id[c]], events=result.leased, release={},
            grants=[_grant(b, "p1"), _grant(c, "p2", cpu=200)], now=NOW,
            lease_ttl_seconds=60,
        )
        assert set(leased) == {b, c} and refused == frozenset()
    async with db.connection() as conn:
        reserved = dict(await conn.fetch("SELECT pool_id, cpu_reserved FROM ledgers"))
        leased_events = await conn.fetchval(
            "SELECT count(*) FROM task_events WHERE reason = 'leased'")
        assert (await task_get(conn, b))["placement"]["poolId"] == "p1"
    assert reserved == {"p1": 800, "p2": 900}
    assert leased_events == 3  # the undone grants' events went with them
    async with db.connection() as conn:  # the rival's 700 on p2 has no reservation behind it
        await conn.execute("UPDATE ledgers SET cpu_reserved = cpu_reserved - 700 "
                           "WHERE pool_id = 'p2'")
    assert await ledger_violations(db) == []


async def test_an_undone_grant_is_admitted_again_with_its_pending_reason(
    db: Database,
) -> None:
    (a,) = await _tasks(db, 1)
    async with db.connection() as conn:
        await conn.execute("UPDATE ledgers SET cpu_total = 100 WHERE pool_id = 'p1'")
        await conn.execute("UPDATE tasks SET pending_reason = $2::jsonb, pending_stage = 4 "
                           "WHERE id = $1", a, REASON)
    async with _pass(db, 1) as (conn, claimed):
        result = await plan_apply(conn, plan=Plan(grants=(_grant(a, "p1"),)), now=NOW,
                                  lease_ttl_seconds=60)
        assert result.refused == {"p1"}
        await grants_settle(conn, undo=claimed, events=result.leased, release={}, grants=[],
                            now=NOW, lease_ttl_seconds=60)
    async with db.connection() as conn:
        task = await task_get(conn, a)
    assert (task["state"], task["pending_reason"], task["pending_stage"]) == (
        "ADMITTED", REASON, 4)
    assert task["placement"] is None and task["leased_at"] is None
    assert await _written(db) == (0, 0, 0, 0)
    assert await ledger_violations(db) == []


async def test_a_later_ledger_statement_skips_rows_others_hold(db: Database) -> None:
    a, b = await _tasks(db, 2)
    async with db.transaction() as rival:
        # Another transaction holds p2's ledger row: waiting for it while holding p1 could
        # deadlock, so the settle refuses p2 at once instead.
        await rival.execute("SELECT 1 FROM ledgers WHERE pool_id = 'p2' FOR UPDATE")
        async with _pass(db, 2) as (conn, claimed):
            result = await plan_apply(conn, plan=Plan(grants=(_grant(a, "p1"),)), now=NOW,
                                      lease_ttl_seconds=60)
            assert result.refused == frozenset()
            leased, refused = await grants_settle(
                conn, undo=[], events={}, release={}, grants=[_grant(b, "p2")], now=NOW,
                lease_ttl_seconds=60,
            )
            assert refused == {"p2"} and set(leased) == {b}
            await grants_settle(conn, undo=[t for t in claimed if t.id == b],
                                events=leased, release={}, grants=[], now=NOW,
                                lease_ttl_seconds=60)
    assert await _written(db) == (1, 1, 400, 1)
    assert await ledger_violations(db) == []



async def test_a_pass_plans_for_its_arrays_without_jit(db: Database) -> None:
    from app.ledger.claims import claims_settings

    async with db.transaction() as conn:
        await claims_settings(conn, idle_seconds=5)
        settings = await conn.fetchrow(
            "SELECT current_setting('plan_cache_mode'), current_setting('jit'), "
            "current_setting('idle_in_transaction_session_timeout')")
    assert tuple(settings) == ("force_custom_plan", "off", "5s")
    async with db.connection() as conn:  # the transaction's settings end with it
        assert await conn.fetchval("SELECT current_setting('plan_cache_mode')") == "auto"


async def test_the_conflict_path_statements_need_no_type_lookup(db: Database) -> None:
    """Undoing a lease sends only types asyncpg encodes without asking the server's
    catalogue (``uuid[]`` is looked up by every pass's claim already): ``smallint[]`` or
    ``bigint[]`` cost a connection's first conflict a type lookup query."""
    from app.ledger import claims

    known = {"uuid[]", "text[]", "text", "timestamptz"}
    async with db.connection() as conn:
        statement = await conn.prepare(claims._UNLEASE)
        names = {t.name for t in statement.get_parameters()}
    assert names <= known, names - known


async def test_undoing_a_lease_reads_the_tasks_by_id_with_stale_statistics(db: Database) -> None:
    """The statistics of a burst's tasks say nothing is leased yet: undoing a lease still looks
    its tasks up by primary key, not by reading every leased task from
    ``ix_tasks_leased_tenant`` (what a plain ``state = 'LEASED'`` condition let it do)."""
    from app.ledger import claims

    async with db.connection() as conn:
        ids = await tasks_add(conn, tenant="t1", count=400, spec=spec_make(cpu=1))
        await conn.execute("ANALYZE tasks")  # every task admitted
        await conn.execute("UPDATE tasks SET state = 'LEASED', leased_at = $1", NOW)
    async with db.transaction() as conn:
        await claims.claims_settings(conn, idle_seconds=5)
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN " + claims._UNLEASE, NOW, ids[:1], ['{"code": "x"}'], "n", "1"))
    assert "ix_tasks_leased_tenant" not in plan, plan
    assert "pk_tasks" in plan, plan
