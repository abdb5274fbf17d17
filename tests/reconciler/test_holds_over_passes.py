"""Holds are never orphaned, over many passes of a changing world.

Generated worlds (:mod:`tests.reconciler.holds_world`: three pools, three tenants in two
cohorts under one root, real PostgreSQL, the real reconciler pass) run a list of steps.
Each step changes the world as its API would — tasks submitted (some may preempt lower
priorities, some want one zone; a tenant's high-priority preemptor and a task of its
nominal submitted together, so that one tenant has a preemptor and a reclaimer waiting at
once), leases completed (succeeded, failed or given back by the runtime), a runtime silent
long enough for its leases to expire, tasks cancelled, a tenant's quota or cohort changed,
a cohort's own quota changed, a pool cordoned, activated, shrunk or grown — then time
passes (a few seconds up to past the grace and nomination times), the leader's recovery
round and the safety sweep run, and one pass reads, plans and commits. Some changes are
aimed at the first task holding capacity (its tenant's quota, a pool it holds on, the task
itself, the revoking lease it waits for): a world rarely hits a holder by chance.

After every pass, from the database:

* the ledger invariants hold (every count of :func:`~app.ledger.invariants.ledger_check`
  is zero, and the tests' own ledger checks find nothing);
* every held unit (hold rows of every kind: a preemptor's, a reclaimer's or fair-share
  reclaimer's, a nominee's) belongs to a task that is ADMITTED and pending as a holder
  (``preempting``, ``reclaiming`` or ``nominated``); whose quota admits it in the book a
  pass plans with (the waiting preemptors' and reclaimers' needs counted as their tenants'
  usage, the whole cohort tree drawn; the holder's own counted need left out and, for a
  preemptor or reclaimer, the usage of the leases being revoked given back, as its
  displacement was planned). So each preemptor or reclaimer fits its quota with every other
  waiting displacement counted, those of its own tenant too: together, once their victims
  have stopped and they are placed, they stay within their tenants' quotas and what the
  cohort tree lends. A nominee's held pools are among its nominated pools, each
  ACTIVE with a total that still covers what it needs there; a preemptor or reclaimer
  still has victims revoking;
* no hold survives two passes without progress. A holder that held after the previous pass
  and holds after this one made progress when its held total grew (its outstanding need
  shrank); else a preemptor or reclaimer must have no victim past its ``revokeBy`` by more
  than one step (the recovery round revokes overdue victims, so one waiting longer is
  stuck), and a nominee must lack on each of its pools no more than live leases reserve
  there (those leases end and their capacity is captured for it; anything else it waits
  for never comes). A holder placed or given back holds nothing and is not checked.
"""

from __future__ import annotations

import itertools
import uuid
from unittest import mock

from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from app.db import Database
from app.ledger import tasks as ledger_tasks
from tests.conftest import database_clean
from tests.reconciler.holds_world import (
    COHORTS,
    LEASE_TTL,
    NOMINATION,
    POOLS,
    TENANTS,
    World,
)

EXAMPLES = 10
STEPS = 24

submits = st.tuples(
    st.just("submit"), st.sampled_from(TENANTS), st.sampled_from([1000, 2000, 3000, 3000, 4000]),
    st.integers(0, 1), st.booleans(), st.sampled_from([None, None, "z0", "z1"]),
    st.integers(1, 3))
ends = st.tuples(st.just("end"), st.sampled_from([-1, -1, 0, 2, 5, 9, 14]),
                 st.sampled_from(["succeeded", "failed", "released"]))
#: A pool a change is aimed at: the first holder's, more often than any other.
AT_POOLS = st.sampled_from((*POOLS, "holder", "holder", "holder"))
#: Each kind of change, with its weight: how many times it is in the draw.
CHANGES = {
    "submit": (4, submits),
    # A tenant's preemptor (priority 1) and a task of its nominal (priority 0), at once.
    "displace": (2, st.tuples(st.just("displace"), st.sampled_from((*TENANTS, "holder")),
                              st.sampled_from([1000, 2000, 3000]),
                              st.sampled_from([1000, 2000, 4000]))),
    "end": (3, ends),
    "quota": (2, st.tuples(st.just("quota"), st.sampled_from((*TENANTS, "holder", "holder")),
                           st.sampled_from(COHORTS),
                           st.sampled_from([0, 1000, 2000, 4000, 8000]),
                           st.sampled_from([None, None, 0, 2000]))),
    "cancel": (1, st.tuples(st.just("cancel"), st.sampled_from([-1, -1, 0, 3, 7, 12]))),
    "silent": (1, st.tuples(st.just("silent"), st.sampled_from(POOLS))),
    "cohort": (1, st.tuples(st.just("cohort"), st.sampled_from(COHORTS),
                            st.sampled_from([0, 2000, 4000]))),
    "status": (2, st.tuples(st.just("status"), AT_POOLS,
                            st.sampled_from(["CORDONED", "ACTIVE", "ACTIVE"]))),
    "capacity": (2, st.tuples(st.just("capacity"), AT_POOLS,
                              st.sampled_from([1000, 2000, 4000, 6000]))),
}
changes = st.sampled_from([k for k, (n, _) in CHANGES.items() for _ in range(n)]).flatmap(
    lambda kind: CHANGES[kind][1])


def kind_of(change: str) -> str:
    """Return what ``"holder"`` names in a change: a tenant or a pool."""
    return "tenant" if change in ("quota", "displace") else "pool"


steps = st.tuples(changes, st.sampled_from([5.0, 20.0, 45.0, NOMINATION + 5]))


async def step_apply(world: World, change: tuple) -> None:
    """Apply one change of the world (a refused PUT changes nothing); a tenant or pool
    ``"holder"`` is the first holder's tenant, or a pool it holds on."""
    kind, *args = change
    if "holder" in args:
        held = await world.holder()
        if held is None:
            return
        args = [{"tenant": held[1], "pool": held[2]}[kind_of(kind)] if a == "holder" else a
                for a in args]
    if kind == "submit":
        await world.submit(*args)
    elif kind == "displace":
        tenant, preemptor, other = args
        await world.submit(tenant, preemptor, 1, True, None, 1)
        await world.submit(tenant, other, 0, False, None, 1)
    elif kind == "end":
        await world.end(*args)
    elif kind == "silent":
        world.silent.add(args[0])
    elif kind == "cancel":
        await world.cancel(*args)
    elif kind == "quota":
        await world.quota(*args)
    elif kind == "cohort":
        await world.cohort_quota(*args)
    elif kind == "status":
        await world.status(*args)
    else:
        await world.capacity(*args)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(script=st.lists(steps, min_size=STEPS // 2, max_size=STEPS))
# Found by this test: a preemptor waiting for its victim kept its holds once its tenant's
# quota refused it (nothing woke it, and a waiting preemptor's quota was never judged).
@example(script=[(("end", -1, "succeeded"), 5.0), (("end", -1, "succeeded"), 5.0),
                 (("cohort", "c1", 0), 5.0), (("submit", "a", 3000, 1, True, None, 1), 5.0),
                 (("quota", "a", "c1", 0, None), 5.0)])
# Found by this test: b's nominal reclaim and, after it in the same pass, a fair-share
# reclaim of b that its quota refused once the first was charged; each then refused the
# other from the next pass on.
@example(script=[*[(("end", -1, "succeeded"), 5.0)] * 3, (("end", -1, "released"), 5.0),
                 (("submit", "a", 2000, 0, False, None, 1), 5.0),
                 *[(("end", -1, "succeeded"), 5.0)] * 2, (("capacity", "p0", 6000), 5.0),
                 *[(("submit", "a", 1000, 0, False, None, 1), 5.0)] * 5,
                 (("submit", "b", 1000, 0, False, None, 2), 5.0),
                 (("submit", "b", 1000, 0, False, None, 3), 5.0)])
# Found by this test: c's preemptor and c's task of its nominal, twice; a reclaim planned
# without the waiting preemptors' needs counted took the room they wait for, and c's
# preemptor then held capacity its quota refused.
@example(script=[(("submit", "a", 4000, 0, True, None, 3), 5.0), (("end", -1, "failed"), 45.0),
                 (("quota", "c", "c2", 2000, None), 65.0), (("end", 9, "failed"), 45.0),
                 (("end", 2, "released"), 5.0), (("status", "holder", "CORDONED"), 65.0),
                 (("displace", "c", 3000, 4000), 5.0), (("displace", "c", 2000, 2000), 20.0)])
async def test_holds_are_never_orphaned_over_many_passes(
    database: Database, script: list[tuple[tuple, float]],
) -> None:
    await database_clean(database)
    world = World(database)
    # Task ids carry random bits, and ties (among equal victims, say) break by id: ids
    # numbered in order make a replayed example the same world.
    numbered = itertools.count(1)
    with mock.patch.object(ledger_tasks, "uuid7", lambda now: uuid.UUID(
            int=(int(now.timestamp() * 1000) << 80) | (0x7 << 76) | next(numbered))):
        try:
            await world.build()
            for change, seconds in script:
                note(f"pass {world.passes + 1}: {change}, then {seconds:g} s")
                await step_apply(world, change)
                # A silent runtime's leases expire: it says nothing for longer than their TTL.
                await world.tick(LEASE_TTL + 5 if change[0] == "silent" else seconds)
        finally:
            await world.rec.close()
