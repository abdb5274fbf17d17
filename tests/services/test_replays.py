"""Replays of recorded passes: identical under the recorded profile; under one weight
changed, the changed decisions are exactly those a fresh plan under that weight gives."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import pytest

from app.config import SHARD_SLOTS
from app.db import Database
from app.ledger.pass_records import pass_record_pools_read, pass_records_read
from app.pass_config import ReconcilerConfig
from app.reconciler import Reconciler
from app.scheduling.planner import plan_outcomes
from app.scheduling.plugins import names
from app.scheduling.plugins.registry import REGISTRY, profile, profile_build
from app.scheduling.profiles import profile_document
from app.scheduling.recording import decisions_decode, inputs_decode, pools_decode
from app.scheduling.spec import StoredSpecs
from app.services.replays import ProfileInvalid, ReplayWindow, replay_run
from tests.factories import NOW, heartbeat_add, pool_add, spec_make, tasks_add

ALL = frozenset(range(SHARD_SLOTS))
COST_WEIGHT = 12


async def _busy(db: Database, owner: str) -> list[str]:
    """Three passes over pools of several cost weights and failure domains."""
    r = Reconciler(db, ReconcilerConfig(), owner_id=owner, slots=ALL)
    async with db.transaction() as conn:
        for i in range(6):
            await pool_add(conn, f"{owner}-p{i}", tenants=["t1", "t2"],
                           capacity=(4000 + 1000 * i, 8192, 0), cost_weight=[1.0, 3.0][i % 2],
                           failure_domain=f"fd{i % 3}")
            await heartbeat_add(conn, f"rt-{owner}-p{i}", at=NOW)
    for k in range(3):
        async with db.transaction() as conn:
            for tenant in ("t1", "t2"):
                await tasks_add(conn, tenant=tenant, count=6, spec=spec_make(cpu=700 + 100 * k))
        assert (await r.run_once(now=NOW + timedelta(seconds=k))).claimed == 12
    return [result.pass_id for result in r.results]


def _changed_doc() -> dict:
    config = ReconcilerConfig()
    doc = profile_document(profile("spread"), "spread", config.pass_settings())
    for score in doc["scores"]:
        if score["name"] == names.COST:
            score["weight"] = COST_WEIGHT
    return doc


async def _fresh_changes(db: Database, pass_ids: list[str]) -> set[tuple[str, str]]:
    """Plan each recorded pass afresh with a profile built from the registry with the cost
    weight changed, and return the (pass, task) whose placement differs from the commit."""
    registry = tuple(dataclasses.replace(r, weight=COST_WEIGHT) if r.name == names.COST else r
                     for r in REGISTRY)
    fresh = profile_build("spread", registry, name="fresh")
    async with db.connection() as conn:
        rows = await pass_records_read(conn, after_id=0, limit=100, pass_ids=pass_ids)
        pools = await pass_record_pools_read(conn, digests={r.pools_digest for r in rows})
    out = set()
    for row in rows:
        inputs = inputs_decode(row.inputs, pools_decode(pools[row.pools_digest]),
                               specs=StoredSpecs(64)).inputs
        outcomes = plan_outcomes(dataclasses.replace(inputs, profile=fresh))
        for d in decisions_decode(row.decisions):
            now = outcomes[uuid.UUID(d.task_id)]
            pool = now.members[0][0] if hasattr(now, "members") else None
            if pool != d.pool_id:
                out.add((row.pass_id, d.task_id))
    return out


async def test_the_recorded_profile_replays_every_decision_identically(db: Database) -> None:
    pass_ids = await _busy(db, "same")
    answer = await replay_run(db, window=ReplayWindow(pass_ids=pass_ids), profile=None, now=NOW)
    assert (answer["passes"], answer["decisions"], answer["identical"]) == (3, 36, 36)
    assert answer["summary"]["plansIdentical"] == 3 and answer["summary"]["defects"] == []
    # The live profile as a file changes nothing either.
    doc = profile_document(profile("spread"), "spread", ReconcilerConfig().pass_settings())
    same = await replay_run(db, window=ReplayWindow(pass_ids=pass_ids), profile=doc, now=NOW)
    assert same["changed"] == [] and same["identical"] == 36


async def test_one_weight_changed_changes_what_a_fresh_plan_changes(db: Database) -> None:
    pass_ids = await _busy(db, "whatif")
    answer = await replay_run(db, window=ReplayWindow(pass_ids=pass_ids),
                              profile=_changed_doc(), now=NOW)
    changed = {(c["passId"], c["taskId"]) for c in answer["changed"]}
    assert changed, "a cost weight of 12 moves work to the cheap pools"
    assert changed == await _fresh_changes(db, pass_ids)
    assert all("cost" in c["why"] for c in answer["changed"])
    s = answer["summary"]
    assert s["profile"] == "given" and s["cascade"] is False
    assert s["decisionsChanged"] == len(changed) == answer["decisions"] - answer["identical"]
    before, after = s["committed"], s["replayed"]
    assert after["costWeightedLoad"] < before["costWeightedLoad"]
    assert sum(after["placedByTenant"].values()) == sum(before["placedByTenant"].values())
    assert set(before["failureDomainsByTenant"]) == {"t1", "t2"}


async def test_the_pass_of_a_task_is_found_by_the_task(db: Database) -> None:
    pass_ids = await _busy(db, "bytask")
    async with db.connection() as conn:
        (row,) = await pass_records_read(conn, after_id=0, limit=10, pass_ids=pass_ids[1:2])
    task_id = decisions_decode(row.decisions)[0].task_id
    answer = await replay_run(db, window=ReplayWindow(task_id=uuid.UUID(task_id)),
                              profile=None, now=NOW)
    assert answer["passes"] == 1 and answer["decisions"] == 12


@pytest.mark.parametrize(("change", "message"), [
    ({"strategy": "pack"}, "strategy must be one of"),
    ({"scores": [{"name": "cost", "weight": 0}]}, "weight must be a positive integer"),
    ({"scores": [{"name": "nope", "weight": 1}]}, "'nope' is not a score"),
    ({"filters": ["cost"]}, "'cost' is not a filter"),
    ({"policy": "random"}, "policy must be one of"),
    ({"settings": {"topK": 0}}, "topK must be"),
    ({"settings": {"speed": 1}}, "unknown setting 'speed'"),
    ({"colour": "red"}, "unknown field 'colour'"),
], ids=["strategy", "weight", "score", "filter", "policy", "topk", "setting", "field"])
async def test_a_bad_profile_is_refused_with_what_is_wrong(
    db: Database, change: dict, message: str
) -> None:
    doc = {**_changed_doc(), **change}
    with pytest.raises(ProfileInvalid, match=message):
        await replay_run(db, window=ReplayWindow(since=timedelta(minutes=10)), profile=doc,
                         now=NOW)
