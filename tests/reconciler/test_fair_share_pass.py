"""Fair sharing in one pass on PostgreSQL: with a usage half-life, the tenant that consumed
more recently waits behind one that did not (without it, claim order and equal shares decide),
and the pass replays to the same decisions from its record."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.tenants import Quota, tenant_put
from app.reconciler import Reconciler, ReconcilerConfig
from app.services.replays import ReplayWindow, replay_run
from tests.factories import NOW, heartbeat_add, pool_add, spec_make, tasks_add


async def _world(db: Database) -> dict[str, str]:
    """One core that a and b (no nominal) borrow from an idle lender; a's task came first,
    and a consumed 6 cores until a second ago."""
    async with db.transaction() as conn:
        await pool_add(conn, "p0", tenants=["a", "b", "lender"], capacity=(1000, 4096, 0))
        await heartbeat_add(conn, "rt-p0", at=NOW)
        for name, nominal in (("lender", 8000), ("a", 0), ("b", 0)):
            await tenant_put(conn, tenant_id=name, cohort="c", fair_weight=1.0, now=NOW,
                             quotas={"standard": {"cpuMillis": Quota(nominal)}})
        (a,) = await tasks_add(conn, tenant="a", spec=spec_make(cpu=1000),
                               admitted_at=NOW - timedelta(seconds=2))
        (b,) = await tasks_add(conn, tenant="b", spec=spec_make(cpu=1000),
                               admitted_at=NOW - timedelta(seconds=1))
        await conn.execute(
            "INSERT INTO fair_usage VALUES ('a', 'standard', 'cpuMillis', 6000, $1)",
            NOW - timedelta(seconds=1))
    return {str(a): "a", str(b): "b"}


@pytest.mark.parametrize(("half_life", "winner"), [(0.0, "a"), (3600.0, "b")],
                         ids=["decay-off", "decay-on"])
async def test_decayed_usage_decides_who_borrows_first(
    db: Database, half_life: float, winner: str
) -> None:
    tenants = await _world(db)
    rec = Reconciler(db, ReconcilerConfig(fair_usage_half_life_seconds=half_life),
                     owner_id="fair", slots=frozenset(range(SHARD_SLOTS)))
    result = await rec.run_once(now=NOW)
    assert result.leased == 1
    assert [tenants[str(t)] for t in result.leased_ids] == [winner]
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT tenant_id FROM fair_usage ORDER BY 1")
    # The pass brought its tenants' rows up to date only with decay on.
    assert [r[0] for r in rows] == (["a", "b"] if half_life else ["a"])
    answer = await replay_run(db, window=ReplayWindow(pass_ids=[result.pass_id]),
                              profile=None, now=NOW)
    assert (answer["decisions"], answer["identical"], answer["changed"]) == (2, 2, [])
