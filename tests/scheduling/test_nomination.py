"""Nomination planning: the pipeline's own decide on pools emptied of lower-ranked work."""

from __future__ import annotations

from datetime import UTC, datetime

from app.scheduling.assumed import Assumed
from app.scheduling.explain import nominated_document
from app.scheduling.nomination import plan_nomination

from .factories import pool, snapshot, spec


def test_a_task_that_fits_only_without_lower_ranked_work_gets_that_pool() -> None:
    snap = snapshot([pool("a", capacity=(4000, 8192, 4), reserved=(3000, 0, 0)),
                     pool("b", capacity=(4000, 8192, 4), reserved=(4000, 0, 0))])
    big = spec(requests={"cpuMillis": 4000})
    # Lower-ranked work holds 2000m on a and all of b: only b would fit without it.
    plan = plan_nomination(big, snap, lower={"a": (2000, 0, 0), "b": (4000, 0, 0)})
    assert plan is not None
    assert plan.pools == (("b", 1, (4000, 0, 0), (0, 0, 0)),)
    # Without lower-ranked work anywhere it fits nowhere: no nomination.
    assert plan_nomination(big, snap, lower={}) is None


def test_the_free_part_is_held_at_once_and_read_from_the_pass_overlay() -> None:
    snap = snapshot([pool("a", capacity=(4000, 8192, 4), reserved=(2500, 0, 0))])
    big = spec(requests={"cpuMillis": 4000})
    plan = plan_nomination(big, snap, lower={"a": (2500, 0, 0)})
    assert plan is not None and plan.free == (1500, 0, 0) and plan.need == (4000, 0, 0)
    assumed = Assumed(snap)
    assumed.add(spec(task_id="small"), [("a", 1)])
    plan = plan_nomination(big, snap, lower={"a": (2500, 0, 0)}, assumed=assumed)
    assert plan is not None and plan.free == (500, 0, 0)


def test_a_gang_gets_its_plan_and_a_pool_nominated_for_another_task_is_excluded() -> None:
    pools = [pool(p, capacity=(4000, 8192, 4), reserved=(4000, 0, 0)) for p in ("a", "b", "c")]
    snap = snapshot(pools)
    gang = spec(requests={"cpuMillis": 2000}, gang={"members": 4, "minPools": 2})
    lower = {p: (4000, 0, 0) for p in ("a", "b", "c")}
    plan = plan_nomination(gang, snap, lower=lower)
    assert plan is not None
    assert sum(c for _, c, _, _ in plan.pools) == 4 and len(plan.pools) == 2
    chosen = {p for p, _, _, _ in plan.pools}
    assert plan_nomination(gang, snap, lower=lower, exclude=frozenset(chosen)) is None


def test_the_pending_reason_names_pools_need_and_holds() -> None:
    doc = nominated_document(None, pool_ids=["a"], need=(4000, 0, 0), held=(1000, 0, 0),
                             since=datetime(2026, 1, 1, tzinfo=UTC))
    assert doc["code"] == "nominated" and doc["poolIds"] == ["a"]
    assert doc["need"] == {"cpuMillis": 4000, "memoryMiB": 0, "llmSlots": 0}
    assert doc["held"]["cpuMillis"] == 1000 and doc["nominatedAt"] == "2026-01-01T00:00:00Z"
