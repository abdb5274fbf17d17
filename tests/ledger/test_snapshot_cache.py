"""``snapshot_read`` with its cache: the static part is reused only while no pool row changed,
and every pass sees current ledgers, health and placements either way."""

from __future__ import annotations

from datetime import timedelta

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.pools import pool_capacity_put, pool_create, pool_delete, pool_status_set
from app.ledger.reservations import ledger_reserve_many
from app.ledger.snapshot import (
    SnapshotCache,
    placements_grouped_read,
    placements_read,
    pools_read,
    snapshot_read,
)
from app.reconciler import Reconciler, ReconcilerConfig
from app.scheduling.explain import preview_document
from app.scheduling.framework import select
from app.scheduling.snapshot import PlacedTask, Snapshot
from tests.factories import NOW, heartbeat_add, pool_add, spec_make, tasks_add
from tests.scheduling.factories import placed_counts, spec

FRESH = 60.0


async def _read(db: Database, cache: SnapshotCache, *, now=NOW, placed=()) -> Snapshot:
    async def placements() -> list[PlacedTask]:
        return list(placed)

    async with db.connection() as conn:
        snap = await snapshot_read(
            conn, now=now, freshness_seconds=FRESH, strategy="spread", placed=placements,
            cache=cache,
        )
    return snap


async def _fresh(db: Database, *, now=NOW, placed=()) -> Snapshot:
    async with db.connection() as conn:
        pools = await pools_read(conn, now=now, freshness_seconds=FRESH)
    return Snapshot.build(pools, placed)


def _same(a: Snapshot, b: Snapshot) -> None:
    assert a.pools == b.pools
    assert (a.cap.tolist(), a.reserved.tolist(), a.fresh.tolist()) == (
        b.cap.tolist(), b.reserved.tolist(), b.fresh.tolist()
    )
    for tenant in ("acme", "other"):
        probe = spec(tenant=tenant, runtimeClass="standard")
        assert preview_document(select(probe, a, explain=True)) == preview_document(
            select(probe, b, explain=True)
        )


async def _pools(db: Database, *ids: str) -> None:
    async with db.transaction() as conn:
        for pid in ids:
            await pool_add(conn, pid, tenants=["acme"], failure_domain=f"fd-{pid}")
            await heartbeat_add(conn, f"rt-{pid}", at=NOW)


async def test_usage_and_health_changes_reuse_the_static_part(db: Database) -> None:
    await _pools(db, "p1", "p2", "p3")
    cache = SnapshotCache()
    first = await _read(db, cache)
    assert (cache.rebuilds, cache.reuses) == (1, 0)
    _same(first, await _fresh(db))

    async with db.transaction() as conn:
        assert await ledger_reserve_many(conn, amounts={"p1": (3000, 0, 0)}, now=NOW) == {"p1"}
        await conn.execute("UPDATE ledgers SET cpu_total = 9000 WHERE pool_id = 'p3'")
        await conn.execute("DELETE FROM ledgers WHERE pool_id = 'p2'")
    later = NOW + timedelta(seconds=FRESH / 2)
    async with db.transaction() as conn:
        await heartbeat_add(conn, "rt-p3", at=later)
    placed = [PlacedTask("x", "acme", {"app": "a"}, ("p3",))]
    second = await _read(db, cache, now=later + timedelta(seconds=FRESH / 2 + 1), placed=placed)
    assert (cache.rebuilds, cache.reuses) == (1, 1)
    assert second.by_tenant is first.by_tenant
    _same(second, await _fresh(db, now=later + timedelta(seconds=FRESH / 2 + 1), placed=placed))
    assert second.reserved[0].tolist() == [3000, 0, 0]
    assert second.pools[1].capacity is None
    assert second.pools[2].capacity[0] == 9000
    assert second.fresh.tolist() == [False, False, True]
    assert placed_counts(second, "acme", None).tolist() == [0, 0, 1]
    # The earlier snapshot is untouched.
    assert first.reserved[0].tolist() == [0, 0, 0] and first.fresh.tolist() == [True] * 3


async def test_cordon_capacity_add_and_delete_rebuild_the_static_part(db: Database) -> None:
    await _pools(db, "p1", "p2")
    cache = SnapshotCache()
    await _read(db, cache)
    rebuilds = cache.rebuilds

    async def check(change) -> Snapshot:
        nonlocal rebuilds
        async with db.transaction() as conn:
            await change(conn)
        snap = await _read(db, cache)
        rebuilds += 1
        assert cache.rebuilds == rebuilds
        _same(snap, await _fresh(db))
        return snap

    async def cordon(conn) -> None:
        await pool_status_set(
            conn, pool_id="p1", status="CORDONED", reason="maintenance", drain_deadline=None,
            now=NOW,
        )

    snap = await check(cordon)
    assert snap.pools[0].status == "CORDONED"
    assert select(spec(runtimeClass="standard"), snap).placement.pool_id == "p2"

    async def resize(conn) -> None:
        await pool_capacity_put(conn, pool_id="p2", totals=(100, 100, 0), now=NOW)

    snap = await check(resize)
    assert snap.pools[1].capacity == (100, 100, 0)
    assert select(spec(runtimeClass="standard"), snap).placement is None

    async def add(conn) -> None:
        await pool_create(
            conn, pool_id="p0",
            fields={"tenant_ids": ["acme"], "runtime_class": "standard",
                    "runtime_instance_id": "rt-p0", "region": "eu-west"},
            now=NOW,
        )
        await pool_capacity_put(conn, pool_id="p0", totals=(4000, 8192, 0), now=NOW)
        await heartbeat_add(conn, "rt-p0", at=NOW)

    snap = await check(add)
    assert snap.ids == ("p0", "p1", "p2")
    assert select(spec(runtimeClass="standard"), snap).placement.pool_id == "p0"

    async def delete(conn) -> None:
        await pool_delete(conn, pool_id="p0")

    snap = await check(delete)
    assert snap.ids == ("p1", "p2")

    async def raw_edit(conn) -> None:
        # A write that bypasses the ledger functions (no version bump) is still noticed.
        await conn.execute("UPDATE pools SET ready = false WHERE id = 'p2'")

    snap = await check(raw_edit)
    assert snap.pools[1].ready is False

    async def untouched(conn) -> None:
        await conn.execute("SELECT 1")

    async with db.transaction() as conn:
        await untouched(conn)
    await _read(db, cache)
    assert cache.rebuilds == rebuilds


async def test_a_strategy_change_rebuilds(db: Database) -> None:
    await _pools(db, "p1")
    cache = SnapshotCache()
    await _read(db, cache)

    async def none() -> list[PlacedTask]:
        return []

    async with db.connection() as conn:
        snap = await snapshot_read(
            conn, now=NOW, freshness_seconds=FRESH, strategy="binpack", placed=none, cache=cache
        )
    assert snap.strategy == "binpack" and cache.rebuilds == 2


async def test_placements_come_from_the_same_read(db: Database) -> None:
    await _pools(db, "p1")
    cache = SnapshotCache()
    async with db.connection() as conn:
        snap = await snapshot_read(
            conn, now=NOW, freshness_seconds=FRESH, strategy="spread",
            placed=lambda: placements_read(conn, tenant_ids={"acme"}), cache=cache,
        )
    assert placed_counts(snap, "acme", None).tolist() == [0]


async def test_grouped_placements_count_exactly_like_per_task_ones(db: Database) -> None:
    async with db.transaction() as conn:
        for i in range(4):
            await pool_add(conn, f"p{i}", tenants=["acme", "other"], capacity=(10_000, 0, 0),
                           failure_domain=f"fd{i % 2}")
            await heartbeat_add(conn, f"rt-p{i}", at=NOW)
        for tenant in ("acme", "other"):
            specs = [spec_make(cpu=100 * (k + 1), labels=lab)
                     for k, lab in enumerate([{"app": "a"}, {"app": "a", "tier": "x"},
                                              {"app": "b"}, {}, {"app": "a"}])]
            specs.append(spec_make(cpu=100, labels={"app": "a"},
                                   gang={"members": 5, "maxPerPool": 2}))
            await tasks_add(conn, tenant=tenant, specs=specs)
        await tasks_add(conn, tenant="third", count=2, spec=spec_make(cpu=100))
    rec = Reconciler(db, ReconcilerConfig(), owner_id="t", slots=frozenset(range(SHARD_SLOTS)))
    assert (await rec.run_once(now=NOW)).leased == 12

    async with db.connection() as conn:
        per_task = await placements_read(conn, tenant_ids={"acme", "other", "nobody"})
        grouped = await placements_grouped_read(conn, tenant_ids={"acme", "other", "nobody"})
    assert len(per_task) == 12 and len(grouped) == 8  # 4 distinct label sets per tenant
    pools = (await _fresh(db)).pools
    a, b = Snapshot.build(pools, per_task), Snapshot.build(pools, grouped)
    for tenant in ("acme", "other", "third"):
        for selector in (None, frozenset(), frozenset({("app", "a")}),
                         frozenset({("app", "a"), ("tier", "x")}), frozenset({("app", "z")})):
            assert (placed_counts(a, tenant, selector).tolist()
                    == placed_counts(b, tenant, selector).tolist())
    assert int(placed_counts(a, "acme", None).sum()) == 10  # 5 single tasks + 5 gang members


async def test_changed_rows_only_between_full_reads_match_a_fresh_read(db: Database) -> None:
    """Between rebuilds a pass reads only the ledger and heartbeat rows written since the
    previous read; every change another writer commits is in its snapshot, every pass."""
    await _pools(db, "p1", "p2", "p3", "p4")
    async with db.transaction() as conn:
        # Two pools on one runtime instance; p4's instance never heartbeated.
        await conn.execute("UPDATE pools SET runtime_instance_id = 'rt-p1' WHERE id = 'p2'")
        await conn.execute("DELETE FROM runtime_instances WHERE id = 'rt-p4'")
        await heartbeat_add(conn, "rt-other", at=NOW)
    cache = SnapshotCache()
    now = NOW
    await _read(db, cache, now=now)
    rebuilds = cache.rebuilds

    async def step(change, *, later: float = 0.0, delta: bool = True) -> Snapshot:
        nonlocal now
        async with db.transaction() as conn:
            await change(conn)
        now = now + timedelta(seconds=later)
        deltas = cache.deltas
        snap = await _read(db, cache, now=now)
        assert cache.rebuilds == rebuilds
        assert cache.deltas == deltas + (1 if delta else 0)
        _same(snap, await _fresh(db, now=now))
        return snap

    async def nothing(conn) -> None:
        await conn.execute("SELECT 1")

    snap = await step(nothing)
    assert snap.fresh.tolist() == [True, True, True, False]

    async def reserve(conn) -> None:
        await ledger_reserve_many(conn, amounts={"p1": (300, 0, 0), "p3": (50, 0, 0)}, now=NOW)

    snap = await step(reserve)
    assert snap.reserved[:, 0].tolist() == [300, 0, 50, 0]

    async def resize_ledger(conn) -> None:
        await conn.execute("UPDATE ledgers SET cpu_total = 9000 WHERE pool_id = 'p4'")

    snap = await step(resize_ledger)
    assert snap.cap[3, 0] == 9000

    # Time passes: freshness is recomputed for every pool without any row written.
    snap = await step(nothing, later=FRESH / 2 + 1)
    assert snap.fresh.tolist() == [True, True, True, False]

    async def beat(conn) -> None:
        await heartbeat_add(conn, "rt-p1", at=now + timedelta(seconds=FRESH / 2))
        await heartbeat_add(conn, "rt-other", at=now)

    snap = await step(beat, later=FRESH / 2)
    assert snap.fresh.tolist() == [True, True, False, False]

    async def release_in_other_transaction(conn) -> None:
        await conn.execute(
            "UPDATE ledgers SET cpu_reserved = cpu_reserved - 300 WHERE pool_id = 'p1'"
        )

    snap = await step(release_in_other_transaction)
    assert snap.reserved[:, 0].tolist() == [0, 0, 50, 0]

    # A ledger or runtime instance added or deleted, or a row the cache never saw, makes the
    # pass read usage and health whole (the static part is still reused).
    async def drop_ledger(conn) -> None:
        await conn.execute("DELETE FROM ledgers WHERE pool_id = 'p3'")

    snap = await step(drop_ledger, delta=False)
    assert snap.pools[2].capacity is None

    async def new_instance(conn) -> None:
        await heartbeat_add(conn, "rt-p4", at=now)

    snap = await step(new_instance, delta=False)
    assert snap.fresh.tolist() == [True, True, False, True]

    async def swap_instances(conn) -> None:
        await conn.execute("DELETE FROM runtime_instances WHERE id = 'rt-other'")
        await heartbeat_add(conn, "rt-fresh", at=now)

    await step(swap_instances, delta=False)
    snap = await step(reserve)
    assert snap.reserved[:, 0].tolist() == [300, 0, 0, 0]

    # A window too old to trust is not used.
    cache.seen = "1:1:"
    await step(nothing, delta=False)
    await step(nothing)


async def test_unchanged_pool_rows_in_a_held_back_window_keep_the_cheap_read(db: Database) -> None:
    """A transaction that was running at the previous read holds its horizon back, so the
    window also holds pool rows written before that read: rows still at the version the
    static part was built from are unchanged (no full read); a row written since is not."""
    async with db.connection() as held:
        await held.execute("BEGIN")
        await held.fetchval("SELECT txid_current()")  # running through every read below
        try:
            await _pools(db, "p1", "p2")
            cache = SnapshotCache()
            await _read(db, cache)
            rebuilds, deltas = cache.rebuilds, cache.deltas
            async with db.transaction() as conn:
                await ledger_reserve_many(conn, amounts={"p2": (700, 0, 0)}, now=NOW)
            snap = await _read(db, cache)
            assert (cache.rebuilds, cache.deltas) == (rebuilds, deltas + 1)
            assert snap.reserved[:, 0].tolist() == [0, 700]
            _same(snap, await _fresh(db))

            async with db.transaction() as conn:
                await pool_status_set(
                    conn, pool_id="p1", status="CORDONED", reason="maintenance",
                    drain_deadline=None, now=NOW,
                )
            snap = await _read(db, cache)
            assert cache.rebuilds == rebuilds + 1
            assert snap.pools[0].status == "CORDONED"
            _same(snap, await _fresh(db))
        finally:
            await held.execute("ROLLBACK")


async def _reserved(db: Database, cache: SnapshotCache) -> list[int]:
    snap = await _read(db, cache)
    assert cache.rebuilds == 1
    _same(snap, await _fresh(db))
    return snap.reserved[:, 0].tolist()


async def test_changes_committed_while_other_transactions_run_are_all_read(
    db: Database,
) -> None:
    """Between two reads, rows come from transactions that were running at the first (one
    open all along, one that writes in a savepoint, whose id no snapshot lists), from the
    reader's own transaction after its read, and from the one left open when it ends: the
    next read applies every change, never a full read."""
    await _pools(db, "p1", "p2", "p3", "p4")
    cache = SnapshotCache()
    async with db.connection() as held, db.connection() as writer:
        await held.execute("BEGIN")
        await held.execute("UPDATE ledgers SET cpu_reserved = 40 WHERE pool_id = 'p4'")
        try:
            assert await _reserved(db, cache) == [0, 0, 0, 0]
            await writer.execute("BEGIN")
            await writer.execute("UPDATE ledgers SET cpu_reserved = 10 WHERE pool_id = 'p1'")
            await writer.execute("SAVEPOINT s")
            await writer.execute("UPDATE ledgers SET cpu_reserved = 20 WHERE pool_id = 'p2'")
            await writer.execute("RELEASE SAVEPOINT s")
            await _one_committed(db)
            assert await _reserved(db, cache) == [0, 0, 0, 0]
            await writer.execute("COMMIT")
            assert await _reserved(db, cache) == [10, 20, 0, 0]

            async with db.transaction() as conn:
                await conn.fetchval("SELECT txid_current()")  # the reader has an id
                await _one_committed(db)
                await snapshot_read(conn, now=NOW, freshness_seconds=FRESH, strategy="spread",
                                    placed=_nothing_placed, cache=cache)
                await ledger_reserve_many(conn, amounts={"p3": (30, 0, 0)}, now=NOW)
            assert await _reserved(db, cache) == [10, 20, 30, 0]
        finally:
            await held.execute("COMMIT")
    assert await _reserved(db, cache) == [10, 20, 30, 40]
    assert cache.deltas == 5


async def _nothing_placed() -> list[PlacedTask]:
    return []


async def _one_committed(db: Database) -> None:
    """Commit a transaction that has an id: the next snapshot's ``xmax`` is then past every
    id handed out so far, running transactions' included."""
    async with db.connection() as conn:
        await conn.fetchval("SELECT txid_current()")


async def test_a_transaction_left_open_does_not_widen_the_reads(db: Database) -> None:
    """While a transaction that has an id stays open, a read returns the rows written since
    the previous read, not every row written since that transaction began.

    Transaction ids are the server's: a transaction of another session (another database
    too) that was running at the previous read and has finished since widens one read to
    the rows written since it began. So the bound is checked over a few reads: such a
    transaction cannot widen every one, while the open one would.
    """
    ids = [f"p{i:02d}" for i in range(12)]
    await _pools(db, *ids)
    cache = SnapshotCache()
    async with db.connection() as held:
        await held.execute("BEGIN")
        await held.fetchval("SELECT txid_current()")
        try:
            await _read(db, cache)
            for i, pid in enumerate(ids):
                async with db.transaction() as conn:
                    await ledger_reserve_many(conn, amounts={pid: (i + 1, 0, 0)}, now=NOW)
                    await heartbeat_add(conn, f"rt-{pid}", at=NOW)
            rows = cache.rows_read
            snap = await _read(db, cache)
            assert cache.rows_read - rows >= 2 * len(ids)
            assert snap.reserved[:, 0].tolist() == list(range(1, 13))
            returned = []
            for _ in range(20):
                for pid in ids[:2]:
                    async with db.transaction() as conn:
                        await ledger_reserve_many(conn, amounts={pid: (1, 0, 0)}, now=NOW)
                rows = cache.rows_read
                await _read(db, cache)
                returned.append(cache.rows_read - rows)
            assert min(returned) == 2, returned
            assert (cache.rebuilds, cache.deltas) == (1, 21)
            _same(await _read(db, cache), await _fresh(db))
        finally:
            await held.execute("ROLLBACK")


async def test_the_reads_of_a_pass_need_no_type_lookup(db: Database) -> None:
    """The snapshot's statements return only columns asyncpg decodes without asking the
    server's catalogue (``text[]``, scalars, ``bytea``): an ``int8[]`` column costs each new
    connection a type lookup query (some 7 ms of server CPU) in its first pass."""
    from app.ledger import snapshot as reads

    builtin = {"text", "text[]", "int4", "int8", "bytea", "bool", "float8", "numeric"}
    async with db.connection() as conn:
        for query in (reads._CHANGED, reads._HEARTBEATS, reads._USAGE):
            statement = await conn.prepare(query)
            names = {a.type.name for a in statement.get_attributes()}
            assert names <= builtin, (query[:40], names - builtin)
