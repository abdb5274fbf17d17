"""The reads of a pass and the queue counts have plans that never read finished tasks.

With sequential scans priced out, each statement must still find an index path that covers
only live rows (queued, claimed, leased, live reservations), and pick it over one that reads
the tenants' history (5,000 finished tasks here): a plan that scans ``tasks`` or walks
``ix_tasks_tenant_seq`` (every task a tenant ever had) grows with history (see
docs/benchmarks.md, "History", for the same plans at 1,000,000 finished tasks).
"""

from __future__ import annotations

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger import preemption, queue, snapshot

SLOTS = list(range(SHARD_SLOTS))
TENANTS = ["t1", "t2"]

STATEMENTS = {
    "queue gauges (pending by code)": (queue._BY_CODE, [SLOTS]),
    "pending counts, all tenants": (queue._PENDING, [None, None]),
    "pending counts of tenants": (queue._PENDING, [TENANTS, None]),
    "placements for affinity (grouped)": (snapshot._PLACED_GROUPED, [TENANTS]),
    "placements for affinity": (snapshot._PLACED, [TENANTS]),
    "tenant usage (fair policy)": (snapshot._TENANT_USAGE, [TENANTS]),
    "preemption victims": (preemption._VICTIMS, [TENANTS, [5, 5]]),
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
async def test_no_plan_reads_history(db: Database, name: str) -> None:
    sql, args = STATEMENTS[name]
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, state, runtime_class, spec, finished_at) "
            "SELECT gen_random_uuid(), ($1::text[])[1 + g % 2], 0, 'SUCCEEDED', 'standard', "
            "'{}', now() FROM generate_series(1, 5000) AS g", TENANTS,
        )
        await conn.execute("ANALYZE tasks")
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args))
    assert "Seq Scan on tasks" not in plan, plan
    assert "ix_tasks_tenant_seq" not in plan, plan
