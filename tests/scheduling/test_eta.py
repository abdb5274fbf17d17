"""The forecast of a waiting task: the planner asked again after each lease ends.

The forecast skips asking the planner while no pool could hold one member of the task even
with every hold given back; these properties check that the skip never changes the answer
(against asking after every lease), and that leases end in the order given.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.pass_config import ReconcilerConfig
from app.scheduling.eta import Forecast, forecast, tasks_until
from app.scheduling.inputs import PassInputs
from app.scheduling.planner import Placed, plan_outcomes
from app.scheduling.plugins.registry import profile
from app.scheduling.records import ClaimedTask, LiveLease
from app.scheduling.snapshot import PoolState, Snapshot
from app.scheduling.spec import StoredSpecs

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _task(seq: int, cpu: int, tenant: str = "t") -> ClaimedTask:
    spec = {"runtimeClass": "std", "requests": {"cpuMillis": cpu}}
    return ClaimedTask(uuid.uuid4(), tenant, seq, 0, orjson.dumps(spec).decode(), NOW, 0)


def _inputs(caps: list[int], leases: list[tuple[int, int]], ahead: list[int], cpu: int,
            holds: dict[int, int] | None = None) -> tuple[PassInputs, ClaimedTask]:
    reserved = [0] * len(caps)
    for pool, amount in leases:
        reserved[pool] += amount
    for pool, amount in (holds or {}).items():
        reserved[pool] += amount
    pairs = enumerate(zip(caps, reserved, strict=True))
    pools = [PoolState(f"p{i}", frozenset({"t"}), "std", f"rt{i}", capacity=(c, 1000, 0),
                       reserved=(r, 0, 0)) for i, (c, r) in pairs]
    tasks = [_task(i, c) for i, c in enumerate(ahead)]
    target = _task(len(ahead), cpu)
    compiled, _ = StoredSpecs().compile_all([*tasks, target])
    inputs = PassInputs(
        now=NOW, settings=ReconcilerConfig().pass_settings(), profile=profile("spread"),
        snapshot=Snapshot.build(pools), tasks=tuple(compiled),
        holds={tasks[0].id: {f"p{p}": (a, 0, 0) for p, a in holds.items()}}
        if holds and tasks else {},
    )
    return dataclasses.replace(inputs, tasks=tasks_until(inputs, target.id)), target


def _asked_after_every_lease(inputs: PassInputs, task_id: uuid.UUID,
                             leases: list[LiveLease]) -> int | None:
    """Return after how many leases the planner places the task, asking it every time."""
    reserved = inputs.snapshot.reserved.copy()
    for ended in range(len(leases) + 1):
        if ended:
            lease = leases[ended - 1]
            reserved[inputs.snapshot.pos[lease.pool_id]][0] -= lease.amount[0]
        step = dataclasses.replace(inputs, snapshot=inputs.snapshot.with_reserved(
            reserved.copy()))
        if isinstance(plan_outcomes(step)[task_id], Placed):
            return ended
    return None


@settings(max_examples=60, deadline=None)
@given(
    caps=st.lists(st.sampled_from([1000, 2000, 4000]), min_size=1, max_size=4),
    data=st.data(),
)
def test_skipping_plans_that_cannot_place_it_never_changes_the_forecast(caps, data) -> None:
    n = len(caps)
    leases = data.draw(st.lists(st.tuples(st.integers(0, n - 1),
                                          st.sampled_from([250, 500, 1000])), max_size=10))
    # Keep every pool within its capacity.
    used = [0] * n
    kept = []
    for pool, amount in leases:
        if used[pool] + amount <= caps[pool]:
            used[pool] += amount
            kept.append((pool, amount))
    ahead = data.draw(st.lists(st.sampled_from([250, 500, 1000, 2000]), max_size=5))
    cpu = data.draw(st.sampled_from([250, 1000, 2000, 3000, 8000]))
    holds = data.draw(st.dictionaries(st.integers(0, n - 1), st.just(250), max_size=2))
    holds = {p: a for p, a in holds.items() if used[p] + a <= caps[p]}
    inputs, target = _inputs(caps, kept, ahead, cpu, holds)
    order = [LiveLease(f"p{p}", "t", "std", (a, 0, 0), NOW) for p, a in kept]
    got = forecast(inputs, target.id, order)
    assert got.ended == _asked_after_every_lease(inputs, target.id, order)


def test_leases_end_in_the_order_given_and_the_tasks_ahead_go_first() -> None:
    # p0 (4000) is full with two leases of 2000; p1 (1000) is full with one.
    inputs, target = _inputs([4000, 1000], [(0, 2000), (0, 2000), (1, 1000)], [1000], 2000)
    leases = [LiveLease("p0", "t", "std", (2000, 0, 0), NOW),
              LiveLease("p0", "t", "std", (2000, 0, 0), NOW),
              LiveLease("p1", "t", "std", (1000, 0, 0), NOW)]
    # The task ahead takes 1000 of the first 2000 freed on p0; the second lease ending makes
    # room for this one.
    assert forecast(inputs, target.id, leases) == Forecast(2, "p0", 1)
    # The p1 lease first: it helps no one alone (the task ahead is placed where spread puts
    # it once a p0 lease has ended too: on p0, 75 % used, rather than p1, 100 %), so all
    # three must end.
    assert forecast(inputs, target.id, [leases[2], leases[0], leases[1]]) == Forecast(
        3, "p0", 1)
    # Past the leases given, no placement: the planner's reason is kept.
    out = forecast(inputs, target.id, leases[:1])
    assert out.ended is None and out.reason is not None
    assert out.reason["code"] == "insufficient_cpu"
