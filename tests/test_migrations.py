"""Migrations: up/down/up works, migrations equal the table models, the ledger CHECKs hold."""

from __future__ import annotations

import importlib
import uuid

import asyncpg
import orjson
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import make_url

from app.db import Database
from app.ledger.tables import metadata
from app.scheduling.explain import PLACEMENT_FORMAT, placement_document
from app.schema import (
    schema_current,
    schema_downgrade,
    schema_engine,
    schema_head,
    schema_upgrade,
)
from tests.conftest import _admin


@pytest.fixture
async def scratch_url(server_url: str):
    """Yield the URL of a new, empty database dropped afterwards."""
    name = f"berth_mig_{uuid.uuid4().hex[:10]}"
    maintenance = make_url(server_url).set(database="postgres").render_as_string(False)
    await _admin(maintenance, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(False)
    finally:
        await _admin(maintenance, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _tables(url: str) -> set[str]:
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            return {r[0] for r in rows}
    finally:
        await db.close()


async def _current(url: str) -> str | None:
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            return await schema_current(conn)
    finally:
        await db.close()


async def test_upgrade_downgrade_upgrade(scratch_url: str) -> None:
    assert await _current(scratch_url) is None
    await schema_upgrade(scratch_url)
    assert {t.name for t in metadata.sorted_tables} <= await _tables(scratch_url)
    assert await _current(scratch_url) == schema_head()

    await schema_downgrade(scratch_url)
    assert await _tables(scratch_url) <= {"alembic_version"}

    await schema_upgrade(scratch_url)
    assert await _current(scratch_url) == schema_head()


async def test_migrations_match_table_models(database_url: str) -> None:
    def _diff(sync_conn):  # type: ignore[no-untyped-def]
        ctx = MigrationContext.configure(sync_conn, opts={"compare_type": True})
        return compare_metadata(ctx, metadata)

    engine = schema_engine(database_url)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(_diff)
    finally:
        await engine.dispose()
    assert diff == []


LEDGER_ROW = (
    "INSERT INTO pools (id, runtime_class, runtime_instance_id, region) "
    "VALUES ('p1', 'gpu', 'rt-1', 'eu-west');"
    "INSERT INTO ledgers (pool_id, cpu_total, memory_total, llm_total) "
    "VALUES ('p1', 1000, 2048, 2)"
)


@pytest.mark.parametrize(
    "update",
    [
        pytest.param("cpu_reserved = 1001", id="cpu-over-total"),
        pytest.param("memory_reserved = 4096", id="memory-over-total"),
        pytest.param("llm_reserved = 3", id="llm-over-total"),
        pytest.param("cpu_reserved = -1", id="cpu-negative"),
        pytest.param("cpu_total = 10, cpu_reserved = 500", id="total-lowered-below-reserved"),
    ],
)
async def test_ledger_check_rejects_over_reserve(db: Database, update: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(LEDGER_ROW)
    with pytest.raises(asyncpg.CheckViolationError, match="check constraint"):
        async with db.transaction() as conn:
            await conn.execute(f"UPDATE ledgers SET {update} WHERE pool_id = 'p1'")
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT cpu_reserved FROM ledgers") == 0


@pytest.mark.parametrize(
    "stmt",
    [
        pytest.param("UPDATE tasks SET state = 'RUNNING'", id="unknown-task-state"),
        pytest.param("UPDATE tasks SET state = 'CLAIMED'", id="claimed-without-owner"),
        pytest.param("UPDATE pools SET status = 'PAUSED'", id="unknown-pool-status"),
        pytest.param("UPDATE pools SET cost_weight = -1", id="negative-cost"),
    ],
)
async def test_state_machine_values_enforced(db: Database, stmt: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(LEDGER_ROW.split(";")[0])
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, runtime_class, spec) "
            "VALUES (gen_random_uuid(), 't1', 0, 'gpu', '{}')"
        )
    with pytest.raises(asyncpg.CheckViolationError, match="check constraint"):
        async with db.transaction() as conn:
            await conn.execute(stmt)


async def test_ids_compare_bytewise(database_url: str) -> None:
    """Tenant, pool and runtime-instance ids are ``COLLATE "C"`` (revision
    0014_keys_collate_c, decision 14), whatever the server's locale: equal ids stay equal,
    and order is byte order."""
    expected = {
        ("pools", "id"), ("pools", "runtime_instance_id"), ("ledgers", "pool_id"),
        ("runtime_instances", "id"), ("tasks", "tenant_id"), ("reservations", "pool_id"),
        ("leases", "pool_id"), ("leases", "runtime_instance_id"),
        ("tenant_queue_counts", "tenant_id"),
    }
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT c.relname, a.attname, co.collname FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_collation co ON co.oid = a.attcollation "
            "WHERE c.relname = ANY($1::text[]) AND a.attnum > 0 AND NOT a.attisdropped",
            sorted({t for t, _ in expected}),
        )
        collations = {(r[0], r[1]): r[2] for r in rows}
        assert {k: collations[k] for k in expected} == dict.fromkeys(expected, "C")
        # Byte order, as the embedded server's C locale has it.
        assert await conn.fetchval(
            "SELECT array_agg(tenant_id ORDER BY tenant_id) FROM (SELECT tenant_id FROM "
            "tenant_queue_counts WHERE false UNION ALL SELECT x FROM unnest("
            "ARRAY['b', 'B', 'ab', 'a-b']) AS x) v"
        ) == ["B", "a-b", "ab", "b"]
    finally:
        await conn.close()


# Placements as revisions before 0016_placement_format stored them, with the documents the API
# served for them (the API rounds to 4 places and serves no ``walkedFrom``).
_OLD_PLACEMENTS = [
    (  # a lean placement: [1, pool ids, scores, components], numbers unrounded
        '[1,["p-a","p-b","p-c"],[284.38071234,143.76981,12.0],'
        '[["least_loaded",84.38071234,"projected 16%"],["cost",100,"cheap"]]]',
        {
            "poolId": "p-a",
            "score": 284.3807,
            "components": [
                {"name": "least_loaded", "value": 84.3807, "reason": "projected 16%"},
                {"name": "cost", "value": 100.0, "reason": "cheap"},
            ],
            "members": [{"poolId": "p-a", "count": 1}],
            "alternatives": [
                {"poolId": "p-b", "score": 143.7698}, {"poolId": "p-c", "score": 12.0}
            ],
        },
    ),
    (  # a document: a gang that walked past p-a
        '{"poolId":"p-b","score":87.6543,"components":[{"name":"least_loaded","value":50.1235,'
        '"reason":"r"}],"members":[{"poolId":"p-b","count":2},{"poolId":"p-c","count":1}],'
        '"alternatives":[{"poolId":"p-c","score":80.0}],"walkedFrom":["p-a"]}',
        {
            "poolId": "p-b",
            "score": 87.6543,
            "components": [{"name": "least_loaded", "value": 50.1235, "reason": "r"}],
            "members": [{"poolId": "p-b", "count": 2}, {"poolId": "p-c", "count": 1}],
            "alternatives": [{"poolId": "p-c", "score": 80.0}],
        },
    ),
    (  # a document without components or alternatives
        '{"poolId":"p-a","score":1,"components":[],"members":[{"poolId":"p-a","count":1}],'
        '"alternatives":[]}',
        {"poolId": "p-a", "score": 1.0, "components": [], "members": [
            {"poolId": "p-a", "count": 1}], "alternatives": []},
    ),
]


async def _placements(url: str) -> dict[str, str | None]:
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            rows = await conn.fetch(
                "SELECT runtime_class, placement FROM tasks WHERE runtime_class <> 'bulk'"
            )
            return {r[0]: r[1] for r in rows}
    finally:
        await db.close()


async def _bulk_formats(url: str) -> list[tuple[int, int]]:
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            rows = await conn.fetch(
                "SELECT (placement::json->>0)::int, count(*) FROM tasks "
                "WHERE runtime_class = 'bulk' GROUP BY 1"
            )
            return [(r[0], r[1]) for r in rows]
    finally:
        await db.close()


async def test_placement_format_migration_rewrites_both_old_forms(
    scratch_url: str,
) -> None:
    """Rows of both old forms (and rows without a placement) are rewritten in version 2 and
    render as the documents served before, over more than one batch; a downgrade writes
    documents back."""
    batch = importlib.import_module("migrations.versions.0016_placement_format").BATCH
    await schema_upgrade(scratch_url, "0014_keys_collate_c")
    stored = [text for text, _ in _OLD_PLACEMENTS] + ["null", '{"code":"x"}', None]
    db = Database(scratch_url, max_size=1)
    try:
        async with db.connection() as conn:
            for i, text in enumerate(stored):
                await conn.execute(
                    "INSERT INTO tasks (id, tenant_id, shard, runtime_class, spec, placement) "
                    "VALUES ($1, 't', 0, $2, '{}', $3)",
                    uuid.uuid4(), f"row-{i}", text,
                )
            # Enough lean placements for a second batch.
            await conn.execute(
                "INSERT INTO tasks (id, tenant_id, shard, runtime_class, spec, placement) "
                "SELECT gen_random_uuid(), 't', 0, 'bulk', '{}', $1 FROM generate_series(1, $2)",
                _OLD_PLACEMENTS[0][0], batch,
            )
    finally:
        await db.close()

    await schema_upgrade(scratch_url)
    after = await _placements(scratch_url)
    assert await _bulk_formats(scratch_url) == [(PLACEMENT_FORMAT, batch)]
    for i, (_, document) in enumerate(_OLD_PLACEMENTS):
        text = after[f"row-{i}"]
        assert text is not None and orjson.loads(text)[0] == PLACEMENT_FORMAT
        assert orjson.dumps(placement_document(text)) == orjson.dumps(document)
    assert orjson.loads(after["row-1"])[5] == ["p-a"]
    assert [after[f"row-{i}"] for i in (3, 4, 5)] == [None, None, None]

    await schema_downgrade(scratch_url, "0014_keys_collate_c")
    before = await _placements(scratch_url)
    for i, (_, document) in enumerate(_OLD_PLACEMENTS):
        text = before[f"row-{i}"]
        assert text is not None
        assert {**orjson.loads(text), "walkedFrom": None} == {**document, "walkedFrom": None}
    assert orjson.loads(before["row-1"])["walkedFrom"] == ["p-a"]
    assert "walkedFrom" not in orjson.loads(before["row-0"])
