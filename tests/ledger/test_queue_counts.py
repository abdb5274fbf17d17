"""tenant_queue_counts stays equal to the queued (ADMITTED or CLAIMED) tasks of each tenant
through inserts, every kind of state change and deletes, in single and multi-row statements."""

from __future__ import annotations

from app.db import Database
from tests.factories import tasks_add

REAL = """
    SELECT tenant_id, count(*)::int FROM tasks WHERE state IN ('ADMITTED', 'CLAIMED')
    GROUP BY tenant_id
"""
COUNTED = "SELECT tenant_id, sum(queued)::int FROM tenant_queue_counts GROUP BY tenant_id"


async def both(db: Database) -> tuple[dict[str, int], dict[str, int]]:
    async with db.connection() as conn:
        real = {r[0]: r[1] for r in await conn.fetch(REAL)}
        counted = {r[0]: r[1] for r in await conn.fetch(COUNTED) if r[1]}
    return counted, real


async def test_the_count_follows_every_statement(db: Database) -> None:
    async with db.transaction() as conn:
        a = await tasks_add(conn, tenant="a", count=5)
        await tasks_add(conn, tenant="b", count=3)
    assert await both(db) == ({"a": 5, "b": 3},) * 2

    steps = [
        # parked tasks are still queued; parking and unparking change nothing
        ("UPDATE tasks SET parked = true WHERE tenant_id = 'a'", {"a": 5, "b": 3}),
        ("UPDATE tasks SET parked = false WHERE tenant_id = 'a'", {"a": 5, "b": 3}),
        ("UPDATE tasks SET state = 'LEASED' WHERE id = ANY($1)", {"a": 3, "b": 3}),
        ("UPDATE tasks SET state = 'ADMITTED' WHERE id = ANY($1)",
         {"a": 5, "b": 3}),  # requeued after a lost lease
        ("UPDATE tasks SET state = 'CANCELLED' WHERE tenant_id = 'b' AND id <> ALL($1)",
         {"a": 5}),
        ("UPDATE tasks SET priority = 7", {"a": 5}),  # no state change
        ("DELETE FROM tasks WHERE id = ANY($1)", {"a": 3}),
    ]
    for sql, expected in steps:
        async with db.connection() as conn:
            await conn.execute(sql, a[:2]) if "$1" in sql else await conn.execute(sql)
        counted, real = await both(db)
        assert counted == real == expected, sql
