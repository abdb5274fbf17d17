"""Reclaim planning in the pure core: who gives back borrowed capacity, and property tests
that there is no reclaim loop (tenants at their nominal never take from each other, and a
reclaim never makes its victim want to reclaim back). The worlds hold gangs (leases on one
or more pools, taken whole or not at all) and the reclaimers may be gangs too (all members
or none)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.scheduling.plugins.quota import QuotaRow
from app.scheduling.preemption import Victim, VictimIndex
from app.scheduling.reclaim import (
    ReclaimBook,
    book_displaced,
    plan_reclaim,
    victim_total,
)
from app.scheduling.snapshot import Snapshot

from .factories import pool, spec

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
COHORT = {"a": "c", "b": "c", "z": "other"}
RESOURCES = ("cpuMillis", "memoryMiB")
P0 = (("p0", 1),)


@dataclass(frozen=True)
class Lease:
    task_id: str
    tenant: str
    priority: int
    leased_at: float
    #: What one member requests.
    req: tuple[int, int, int]
    #: (pool id, members) per pool: a gang when it has more than one member.
    members: tuple[tuple[str, int], ...]

    def victim(self) -> Victim:
        return Victim(self.task_id, self.tenant, self.priority, self.leased_at, self.req,
                      self.members)

    @property
    def count(self) -> int:
        return sum(c for _, c in self.members)

    def total(self) -> np.ndarray:
        return np.array(self.req, dtype=np.int64) * self.count

    def on(self, pool_id: str) -> np.ndarray:
        return np.array(self.req, dtype=np.int64) * sum(
            c for p, c in self.members if p == pool_id)


@dataclass
class World:
    caps: dict[str, tuple[int, int, int]]
    leases: list[Lease]
    nominal: dict[str, tuple[int, int]]
    #: Whether memory is managed too (cpu always is).
    memory: bool

    def used(self, tenant: str) -> np.ndarray:
        return sum((x.total() for x in self.leases if x.tenant == tenant),
                   np.zeros(3, dtype=np.int64))

    def rows(self) -> list[QuotaRow]:
        out = []
        for tenant, nominal in self.nominal.items():
            used = self.used(tenant)
            for k, resource in enumerate(RESOURCES[: 2 if self.memory else 1]):
                out.append(QuotaRow(tenant, "py", resource, COHORT[tenant], nominal[k], None,
                                    None, int(used[k])))
        return out

    def snapshot(self) -> Snapshot:
        pools = []
        for pid, cap in self.caps.items():
            reserved = sum((x.on(pid) for x in self.leases), np.zeros(3, dtype=np.int64))
            pools.append(pool(pid, tenant_ids={"a", "b", "z"}, capacity=cap,
                              reserved=tuple(int(v) for v in reserved)))
        return Snapshot.build(pools, [])

    def free(self, pool_id: str) -> np.ndarray:
        return np.array(self.caps[pool_id], dtype=np.int64) - sum(
            (x.on(pool_id) for x in self.leases), np.zeros(3, dtype=np.int64))

    def plan(self, tenant: str, req: tuple[int, int, int], task_id: str = "new",
             members: int = 1, max_per_pool: int | None = None):
        snap = self.snapshot()
        book = ReclaimBook(self.rows(), COHORT)
        gang = {"gang": {"members": members, "maxPerPool": max_per_pool}} if members > 1 else {}
        s = spec(tenant=tenant, task_id=task_id,
                 requests={"cpuMillis": req[0], "memoryMiB": req[1]}, **gang)
        return plan_reclaim(s, snap, VictimIndex(snap, [x.victim() for x in self.leases]),
                            book), book, s

    def managed(self) -> np.ndarray:
        return np.array([True, self.memory, False])

    def borrows(self, tenant: str) -> np.ndarray:
        nominal = np.array([*self.nominal[tenant], 0])
        return (self.used(tenant) > nominal) & self.managed()

    def within(self, tenant: str, need: np.ndarray) -> bool:
        nominal = np.array([*self.nominal[tenant], 0])
        m = self.managed()
        return bool(((self.used(tenant) + need)[m] <= nominal[m]).all())


#: Members of a lease or a reclaimer: mostly single tasks, some gangs.
MEMBERS = st.sampled_from([1, 1, 1, 2, 3])
REQS = st.sampled_from([(500, 0, 0), (1000, 0, 0), (2000, 0, 0), (1000, 1024, 0),
                        (500, 2048, 0)])


@st.composite
def worlds(draw, *, at_nominal: bool = False, crowded: bool = False) -> World:
    """Random cohorts; ``crowded``: two or three full-ish pools, mostly a's and z's leases,
    b with a nominal of its own to reclaim (where gang reclaimers find something)."""
    caps = {f"p{i}": (draw(st.integers(1, 6)) * 1000, 8192, 0)
            for i in range(draw(st.integers(2 if crowded else 1, 3)))}
    memory = draw(st.booleans())
    nominal = {t: (draw(st.integers(0, 8)) * 1000, draw(st.integers(0, 4)) * 2048)
               for t in COHORT}
    if crowded:
        nominal["b"] = (draw(st.integers(4, 12)) * 1000, draw(st.integers(2, 4)) * 2048)
    free = {p: np.array(c, dtype=np.int64) for p, c in caps.items()}
    leases: list[Lease] = []
    owners = ["a", "a", "a", "b", "z"] if crowded else sorted(COHORT)
    for j in range(draw(st.integers(6 if crowded else 0, 20 if crowded else 14))):
        tenant = draw(st.sampled_from(owners))
        req = draw(REQS)
        # A gang's members go one by one to the first pool with room (maybe the same one).
        room = {p: f.copy() for p, f in free.items()}
        placed: dict[str, int] = {}
        for _ in range(draw(MEMBERS)):
            pid = next((p for p in sorted(caps) if (room[p] >= np.array(req)).all()), None)
            if pid is None:
                break
            room[pid] -= np.array(req)
            placed[pid] = placed.get(pid, 0) + 1
        else:
            lease = Lease(f"l{j:02d}", tenant, draw(st.integers(0, 3)),
                          float(draw(st.integers(0, 10))), req, tuple(sorted(placed.items())))
            w = World(caps, [*leases, lease], nominal, memory)
            if at_nominal and w.borrows(tenant).any():
                continue  # every tenant stays within its nominal
            free = room
            leases.append(lease)
    return World(caps, leases, nominal, memory)


@given(worlds(), st.sampled_from(["a", "b", "z"]), REQS, MEMBERS)
@SETTINGS
def test_a_reclaim_takes_only_borrowed_work_of_the_cohort_and_no_more(
    world, tenant, req, members
):
    check_reclaim(world, tenant, req, members)


@given(worlds(crowded=True), st.sampled_from(["b", "b", "a"]), REQS, st.integers(2, 4),
       st.sampled_from([None, 1, 2]))
@SETTINGS
def test_a_gang_reclaims_for_all_its_members_or_not_at_all(
    world, tenant, req, members, max_per_pool
):
    check_reclaim(world, tenant, req, members, max_per_pool)


def check_reclaim(world: World, tenant: str, req: tuple[int, int, int], members: int,
                  max_per_pool: int | None = None) -> None:
    planned, _, s = world.plan(tenant, req, members=members, max_per_pool=max_per_pool)
    if planned is None:
        return
    need = np.array(s.total_requests, dtype=np.int64)
    # Only a task within its tenant's nominal (with all its members) reclaims.
    assert world.within(tenant, need)
    by_id = {x.task_id: x for x in world.leases}
    victims = [by_id[v.task_id] for v in planned.victims]
    assert victims and len(set(planned.victims)) == len(victims)
    for x in victims:
        # Other tenants of its cohort only, and only tenants that borrow.
        assert x.tenant != tenant and COHORT[x.tenant] == COHORT[tenant]
        assert world.borrows(x.tenant).any()
    # Never a victim tenant below its nominal in what it borrowed (a gang counts whole).
    after = World(world.caps, [x for x in world.leases if x not in victims], world.nominal,
                  world.memory)
    for t in {x.tenant for x in victims}:
        nominal = np.array([*world.nominal[t], 0])
        borrowed = world.borrows(t)
        assert (after.used(t)[borrowed] >= nominal[borrowed]).all()
    # All members or none: every member has a pool, and fits there once the victims (every
    # pool of a gang victim) are gone.
    assert sum(c for _, c in planned.members) == members
    assert max_per_pool is None or max(c for _, c in planned.members) <= max_per_pool
    assert len({p for p, _ in planned.members}) == len(planned.members)
    req_v = np.array(s.requests, dtype=np.int64)
    for pool_id, count in planned.members:
        assert (after.free(pool_id) >= req_v * count).all()
    # Every victim holds something on a pool of the plan, and is needed there: without it
    # some member would not fit. (A gang reclaimer's sets are picked pool by pool, so a gang
    # victim picked for a later pool may free an earlier pool too: greedy, not minimal.)
    pools = dict(planned.members)
    spans = any(len(x.members) > 1 for x in victims)
    for x in victims:
        assert any(x.on(p).any() for p in pools)
        if members == 1 or not spans:
            assert any(not ((after.free(p) - x.on(p)) >= req_v * c).all()
                       for p, c in pools.items() if x.on(p).any())


@given(worlds(at_nominal=True), st.sampled_from(["a", "b", "z"]), REQS, MEMBERS)
@SETTINGS
def test_tenants_at_their_nominal_never_take_from_each_other(world, tenant, req, members):
    planned, _, _ = world.plan(tenant, req, members=members)
    assert planned is None


@given(worlds(), st.sampled_from(["a", "b"]), REQS, MEMBERS)
@SETTINGS
def test_a_reclaim_never_makes_its_victims_want_to_reclaim_back(world, tenant, req, members):
    check_no_loop(world, tenant, req, members)


@given(worlds(crowded=True), st.sampled_from(["b", "b", "a"]), REQS, st.integers(2, 4))
@SETTINGS
def test_a_gangs_reclaim_never_makes_its_victims_want_to_reclaim_back(
    world, tenant, req, members
):
    check_no_loop(world, tenant, req, members)


def check_no_loop(world: World, tenant: str, req: tuple[int, int, int], members: int) -> None:
    planned, book, s = world.plan(tenant, req, members=members)
    if planned is None:
        return
    by_id = {x.task_id: x for x in world.leases}
    victims = [by_id[v.task_id] for v in planned.victims]
    mine = Lease("new", tenant, 0, 99.0, s.requests, planned.members)
    after = World(world.caps, [x for x in world.leases if x not in victims] + [mine],
                  world.nominal, world.memory)
    # The reclaimer borrows nothing now: nobody can take from it.
    assert not after.borrows(tenant).any()
    # Each victim (a gang with all its members), back in the queue, reclaims nothing.
    for x in victims:
        again, _, _ = after.plan(x.tenant, x.req, task_id=f"again-{x.task_id}",
                                 members=x.count)
        assert again is None
    # The book the pass follows agrees with the world after the reclaim.
    book_displaced(book, s, planned.victims)
    for t in COHORT:
        assert (book.borrowed(t, "py") == np.where(after.managed(), np.maximum(
            after.used(t) - np.array([*world.nominal[t], 0]), 0), 0)).all()


def test_victims_lowest_priority_then_newest_and_exactly_what_is_needed():
    world = World(
        caps={"p0": (4000, 8192, 0)},
        leases=[Lease("old-low", "a", 0, 1.0, (1000, 0, 0), P0),
                Lease("new-low", "a", 0, 5.0, (1000, 0, 0), P0),
                Lease("new-high", "a", 2, 9.0, (1000, 0, 0), P0),
                Lease("mine", "b", 0, 0.0, (1000, 0, 0), P0)],
        nominal={"a": (1000, 0), "b": (3000, 0), "z": (0, 0)}, memory=False)
    planned, _, _ = world.plan("b", (1000, 0, 0))
    assert [v.task_id for v in planned.victims] == ["new-low"]
    planned, _, _ = world.plan("b", (2000, 0, 0))
    assert sorted(v.task_id for v in planned.victims) == ["new-low", "old-low"]
    # b with 3000 would pass its nominal (it uses 1000 of 3000): no reclaim.
    assert world.plan("b", (3000, 0, 0))[0] is None


def test_never_a_lease_younger_than_the_minimum_runtime():
    world = World(
        caps={"p0": (2000, 8192, 0)},
        leases=[Lease("young", "a", 0, 50.0, (1000, 0, 0), P0),
                Lease("old", "a", 0, 10.0, (1000, 0, 0), P0)],
        nominal={"a": (0, 0), "b": (2000, 0), "z": (0, 0)}, memory=False)
    snap = world.snapshot()
    index = VictimIndex(snap, [x.victim() for x in world.leases])
    s = spec(tenant="b", task_id="t", requests={"cpuMillis": 1000})
    book = ReclaimBook(world.rows(), COHORT)
    planned = plan_reclaim(s, snap, index, book, leased_before=20.0)
    assert [v.task_id for v in planned.victims] == ["old"]
    assert plan_reclaim(s, snap, index, book, leased_before=5.0) is None


def test_a_gang_victim_counts_all_its_members_against_its_tenants_borrowing():
    gang = Victim("gang", "a", 0, 9.0, (1000, 0, 0), (("p0", 1), ("p1", 1)))
    snap = Snapshot.build([pool(p, tenant_ids={"a", "b"}, capacity=(1000, 8192, 0),
                                reserved=(1000, 0, 0)) for p in ("p0", "p1")], [])
    # a borrows 1000 only: taking the gang (2000 in all) would put it below its nominal.
    rows = [QuotaRow("a", "py", "cpuMillis", "c", 1000, None, None, 2000),
            QuotaRow("b", "py", "cpuMillis", "c", 1000, None, None, 0)]
    s = spec(tenant="b", task_id="t", requests={"cpuMillis": 1000})
    assert victim_total(gang).tolist() == [2000, 0, 0]
    assert plan_reclaim(s, snap, VictimIndex(snap, [gang]), ReclaimBook(rows)) is None


def two_pools(a_nominal: int) -> tuple[Snapshot, VictimIndex, ReclaimBook]:
    """Pools p0, p1 of 2 cores, each full with two 1-core leases of a (nominal ``a_nominal``);
    b (nominal 2000) uses nothing."""
    world = World(
        caps={"p0": (2000, 8192, 0), "p1": (2000, 8192, 0)},
        leases=[Lease(f"a{i}", "a", 0, float(i), (1000, 0, 0), ((f"p{i % 2}", 1),))
                for i in range(4)],
        nominal={"a": (a_nominal, 0), "b": (2000, 0), "z": (0, 0)}, memory=False)
    snap = world.snapshot()
    return snap, VictimIndex(snap, [x.victim() for x in world.leases]), ReclaimBook(
        world.rows(), COHORT)


def test_a_gang_reclaims_on_two_pools_at_once():
    snap, index, book = two_pools(2000)
    s = spec(tenant="b", task_id="g", gang={"members": 2, "maxPerPool": 1})
    planned = plan_reclaim(s, snap, index, book)
    assert sorted(planned.members) == [("p0", 1), ("p1", 1)]
    # The newest lease of a on each pool.
    assert sorted(v.task_id for v in planned.victims) == ["a2", "a3"]
    assert sorted(planned.holds) == [("p0", 1, (0, 0, 0)), ("p1", 1, (0, 0, 0))]


def test_a_gangs_pools_share_their_victim_tenants_budget():
    # a borrows 1000 only: one pool's lease may go, not one on each pool.
    snap, index, book = two_pools(3000)
    s = spec(tenant="b", task_id="g", gang={"members": 2, "maxPerPool": 1})
    assert plan_reclaim(s, snap, index, book) is None
    # A single task of b takes that one lease.
    planned = plan_reclaim(spec(tenant="b", task_id="t"), snap, index, book)
    assert [v.task_id for v in planned.victims] == ["a3"]


def test_a_gang_over_its_tenants_nominal_does_not_reclaim():
    snap, index, book = two_pools(2000)
    s = spec(tenant="b", task_id="g", gang={"members": 3})
    assert plan_reclaim(s, snap, index, book) is None
