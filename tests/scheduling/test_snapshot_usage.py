"""``Snapshot.with_usage`` (the reconciler's reuse of a snapshot's static part) and the
incrementally kept per-tenant domain counts of ``Assumed``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduling import snapshot as snapshot_module
from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle
from app.scheduling.explain import preview_document
from app.scheduling.framework import select
from app.scheduling.reasons import Reason
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import TaskSpec, compile_spec
from tests.scheduling.factories import placed_counts, pool, spec
from tests.scheduling.test_properties import GANGS, SETTINGS, TENANTS, specs, worlds


def _usage(pools: list[PoolState]) -> dict:
    by_id = sorted(pools, key=lambda p: p.id)
    return {
        "capacity": [p.capacity for p in by_id],
        "reserved": [p.reserved for p in by_id],
        "fresh": [p.heartbeat_fresh for p in by_id],
    }


@st.composite
def changed_usage(draw, pools: list[PoolState]) -> list[PoolState]:
    """Return ``pools`` with new ledger totals, reservations and heartbeat freshness."""
    out = []
    for p in pools:
        cap = draw(st.none() | st.tuples(*[st.integers(0, 8)] * 3))
        cap = None if cap is None else tuple(c * 500 for c in cap)
        reserved = (0, 0, 0) if cap is None else tuple(draw(st.integers(0, c)) for c in cap)
        fresh = draw(st.booleans())
        out.append(
            PoolState(
                p.id, p.tenant_ids, p.runtime_class, p.runtime_instance_id, p.region,
                p.data_residency, p.failure_domain, p.labels, p.artifact_regions,
                p.cost_weight, p.status, p.ready, fresh, cap, reserved,
            )
        )
    return out


def _warm(snap: Snapshot, pools: list[PoolState]) -> None:
    """Fill the snapshot's memo tables as earlier tasks of a pass would."""
    for tenant in TENANTS:
        for rc in ("py", "node"):
            select(spec(tenant=tenant, runtimeClass=rc), snap)
    select(spec(constraints={"poolSelector": {"app": "x"}, "artifactRegion": "r2"}), snap)
    for tenant in TENANTS:
        for topology in ("pool", "failureDomain", "region"):
            term = {"selector": {"app": "x"}, "topology": topology}
            select(spec(tenant=tenant, affinity={"preferred": [{**term, "weight": 5}]}), snap)
            select(spec(tenant=tenant, affinity={"required": [term]}), snap)


@SETTINGS
@given(worlds(), st.data(), specs(GANGS), st.lists(st.booleans(), max_size=4))
def test_a_rebuilt_snapshot_selects_exactly_like_a_fresh_build(world, data, s, adds):
    pools, placed = world
    old = Snapshot.build(pools, placed)
    _warm(old, pools)
    changed = data.draw(changed_usage(pools))
    new_placed = placed[: data.draw(st.integers(0, len(placed)))] + [
        PlacedTask(f"n{j}", data.draw(st.sampled_from(TENANTS)), {}, (p.id,))
        for j, p in enumerate(data.draw(st.lists(st.sampled_from(pools), max_size=4)))
    ]
    reused = old.with_usage(**_usage(changed), placed=new_placed)
    fresh = Snapshot.build(changed, new_placed)
    a_reused, a_fresh = Assumed(reused), Assumed(fresh)
    for k, add in enumerate(adds):
        # Place a few earlier tasks in both, so the overlays hold the same assumptions.
        earlier = spec(tenant=s.tenant_id, task_id=f"e{k}", requests={"cpuMillis": 100})
        r1 = select(earlier, reused, assumed=a_reused)
        r2 = select(earlier, fresh, assumed=a_fresh)
        assert preview_document(r1) == preview_document(r2)
        if add and r1.placement is not None:
            a_reused.add(earlier, r1.placement.members)
            a_fresh.add(earlier, r2.placement.members)
    for explain in (False, True):
        got = select(s, reused, assumed=a_reused, explain=explain)
        want = select(s, fresh, assumed=a_fresh, explain=explain)
        assert preview_document(got) == preview_document(want)
        assert got.rejection_counts == want.rejection_counts
    # The derived arrays the scorers read agree too (not only where they change the ranking).
    for tenant in TENANTS:
        probe = compile_spec(
            TaskSpec.model_validate({
                "runtimeClass": "py", "requests": {"cpuMillis": 1},
                "affinity": {"preferred": [
                    {"selector": {"app": "x"}, "topology": "region", "weight": 1}
                ]},
            }),
            tenant_id=tenant, task_id="probe",
        )
        c1, c2 = Cycle(probe, reused, a_reused), Cycle(probe, fresh, a_fresh)
        for topology in ("pool", "failureDomain", "region"):
            d1, n1 = c1.tenant_domain_counts(topology)
            d2, n2 = c2.tenant_domain_counts(topology)
            assert n1[d1].tolist() == n2[d2].tolist()
        t1, t2 = c1.term_counts(probe.preferred[0]), c2.term_counts(probe.preferred[0])
        assert (t1[0].tolist(), t1[1]) == (t2[0].tolist(), t2[1])
        for rc in ("py", "node"):
            probe_rc = spec(tenant=tenant, runtimeClass=rc)
            assert preview_document(select(probe_rc, reused, explain=True)) == preview_document(
                select(probe_rc, fresh, explain=True)
            )
    assert reused.pools == fresh.pools
    for name in ("cap", "has_ledger", "reserved", "fresh", "status", "ready", "fd", "cost"):
        assert np.array_equal(getattr(reused, name), getattr(fresh, name)), name


def test_with_usage_leaves_the_old_snapshot_as_it_was():
    pools = [pool("p1"), pool("p2", reserved=(1000, 0, 0))]
    old = Snapshot.build(pools)
    before = (old.pools, old.cap.copy(), old.reserved.copy(), old.fresh.copy())
    new = old.with_usage(
        capacity=[(2000, 10, 0), None], reserved=[(500, 0, 0), (0, 0, 0)], fresh=[False, True]
    )
    assert (old.pools, old.cap.tolist(), old.reserved.tolist(), old.fresh.tolist()) == (
        before[0], before[1].tolist(), before[2].tolist(), before[3].tolist()
    )
    assert new.pools[0].capacity == (2000, 10, 0) and new.pools[0].heartbeat_fresh is False
    assert new.pools[1].capacity is None and not new.has_ledger[1]
    assert new.pools[1].labels is old.pools[1].labels
    # An unchanged pool keeps its state object; the static indexes are shared.
    same = old.with_usage(**_usage(pools))
    assert all(a is b for a, b in zip(same.pools, old.pools, strict=True))
    assert same.by_tenant is old.by_tenant
    assert all(hasattr(new, name) for name in Snapshot.__slots__)


def test_with_usage_rejects_misaligned_usage():
    old = Snapshot.build([pool("p1"), pool("p2")])
    try:
        old.with_usage(capacity=[None], reserved=[(0, 0, 0)], fresh=[True])
    except ValueError as exc:
        assert "2 pools" in str(exc)
    else:
        raise AssertionError("misaligned usage accepted")


def test_a_runtime_going_stale_drops_the_memoized_static_verdicts():
    old = Snapshot.build([pool("p1"), pool("p2")])
    assert select(spec(), old).placement.pool_id == "p1"
    stale = old.with_usage(
        capacity=[(4000, 8192, 4)] * 2, reserved=[(0, 0, 0)] * 2, fresh=[False, True]
    )
    result = select(spec(), stale, explain=True)
    assert result.placement.pool_id == "p2"
    assert result.rejection_counts == {Reason.RUNTIME_UNHEALTHY: 1}
    # Back to fresh: the stale verdict is not carried over either.
    again = stale.with_usage(
        capacity=[(4000, 8192, 4)] * 2, reserved=[(0, 0, 0)] * 2, fresh=[True, True]
    )
    assert select(spec(), again).placement.pool_id == "p1"


def test_a_removed_ledger_and_new_placements_are_seen():
    pools = [pool("p1", failure_domain="f1"), pool("p2", failure_domain="f2")]
    old = Snapshot.build(pools)
    assert select(spec(), old).placement.pool_id == "p1"
    assert placed_counts(old, "acme", None).tolist() == [0, 0]
    placed = [PlacedTask("x", "acme", {"app": "a"}, ("p2",))]
    new = old.with_usage(
        capacity=[None, (4000, 8192, 4)], reserved=[(0, 0, 0)] * 2, fresh=[True, True],
        placed=placed,
    )
    result = select(spec(), new, explain=True)
    assert result.placement.pool_id == "p2"
    assert result.rejection_counts == {Reason.LEDGER_MISSING: 1}
    assert placed_counts(new, "acme", None).tolist() == [0, 1]
    assert placed_counts(old, "acme", None).tolist() == [0, 0]


def _recount(assumed: Assumed, tenant: str, topology: str) -> list[int]:
    snap = assumed.snapshot
    dom, nd = snap.domains(topology)
    extra = assumed.placed_counts(tenant, None)
    if extra is None:
        return [0] * nd
    at, members = extra
    assert at.tolist() == sorted(set(at.tolist())) and (members > 0).all()
    return np.bincount(dom.take(at), weights=members, minlength=nd).astype(np.int64).tolist()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.lists(st.integers(0, 5), min_size=1,
                  max_size=3, unique=True), st.integers(1, 3), st.booleans()),
        max_size=12,
    )
)
def test_assumed_domain_counts_follow_adds_and_removes(ops):
    pools = [
        pool(f"p{i}", tenant_ids={"a", "b"}, failure_domain=f"f{i % 3}", region=f"r{i % 2}")
        for i in range(6)
    ]
    snap = Snapshot.build(pools)
    assumed = Assumed(snap)
    # Each tenant's actual members per domain, as the snapshot counts them.
    actual = {(t, topology): np.arange(snap.domains(topology)[1], dtype=np.int64) + k
              for k, t in enumerate("ab") for topology in ("failureDomain", "region", "pool")}
    # Ask before any placement too: tracking starts at the first question.
    assert assumed.domain_totals("a", "failureDomain", actual["a", "failureDomain"]).tolist() \
        == actual["a", "failureDomain"].tolist()
    for k, (tenant, where, count, undo) in enumerate(ops):
        s = compile_spec(
            TaskSpec.model_validate({"runtimeClass": "py", "requests": {"cpuMillis": 10}}),
            tenant_id=tenant, task_id=f"t{k}",
        )
        assumed.add(s, [(f"p{i}", count) for i in where])
        if undo:
            assumed.remove(f"t{k - 1}" if k else "t0")
        for t in ("a", "b"):
            for topology in ("failureDomain", "region", "pool"):
                got = assumed.domain_totals(t, topology, actual[t, topology])
                want = _recount(assumed, t, topology)
                assert (got - actual[t, topology]).tolist() == want
    used = snap.reserved + assumed.usage
    assert assumed.used.tolist() == used.tolist()


def test_spreading_counts_actual_and_assumed_members_per_domain():
    pools = [pool(f"p{i}", failure_domain=f"f{i % 2}") for i in range(4)]
    placed = [PlacedTask("x", "acme", {}, ("p0", "p2"))]
    snap = Snapshot.build(pools, placed)
    assumed = Assumed(snap)
    assumed.add(spec(task_id="y"), [("p1", 3)])
    dom, per_domain = Cycle(spec(task_id="z"), snap, assumed).tenant_domain_counts(
        "failureDomain"
    )
    assert per_domain[dom].tolist() == [2, 3, 2, 3]


def test_carried_memo_entries_are_bounded(monkeypatch):
    old = Snapshot.build([pool("p1", labels={"a": "1"})])
    for k in range(5):
        old.selector_mask(frozenset({("a", str(k))}))
    usage = _usage(list(old.pools))
    assert old.with_usage(**usage).memo_size == 5
    monkeypatch.setattr(snapshot_module, "MEMO_CARRIED", 4)
    fresh = old.with_usage(**usage)
    assert fresh.memo_size == 0
    assert fresh.selector_mask(frozenset({("a", "1")})).tolist() == [True]


def test_member_counts_count_like_repeated_pools():
    pools = [pool("p1", failure_domain="f1"), pool("p2", failure_domain="f2"),
             pool("p3", failure_domain="f1")]
    counted = [
        PlacedTask("g1", "acme", {"app": "a"}, ("p2", "gone", "p1", "p2"), (2, 5, 1, 3)),
        PlacedTask("g2", "acme", {"app": "b"}, ("p3",), (4,)),
        PlacedTask("g3", "acme", {"app": "c"}, ("gone",), (7,)),
    ]
    repeated = [
        PlacedTask("t1", "acme", {"app": "a"}, ("p2", "p2", "gone", "p1", "p2", "p2", "p2")),
        PlacedTask("t2", "acme", {"app": "b"}, ("p3",) * 4),
    ]
    a, b = Snapshot.build(pools, counted), Snapshot.build(pools, repeated)
    for selector in (None, frozenset({("app", "a")}), frozenset({("app", "b")}),
                     frozenset({("app", "c")})):
        assert (placed_counts(a, "acme", selector).tolist()
                == placed_counts(b, "acme", selector).tolist())
    assert placed_counts(a, "acme", None).tolist() == [1, 5, 4]
    usage = Snapshot.build(pools).with_usage(
        capacity=[None] * 3, reserved=[(0, 0, 0)] * 3, fresh=[True] * 3, placed=counted
    )
    assert placed_counts(usage, "acme", frozenset({("app", "a")})).tolist() == [1, 5, 0]


_TENANT_SETS = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3)
_LABEL_SETS = st.dictionaries(st.sampled_from(["tier", "zone"]), st.sampled_from(["x", "y"]))


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans()), max_size=12),
       st.lists(_TENANT_SETS, min_size=4, max_size=4),
       st.lists(_LABEL_SETS, min_size=4, max_size=4))
@settings(max_examples=150, deadline=None)
def test_indexes_are_the_same_with_shared_or_separate_collections(rows, tenant_sets, label_sets):
    """Pools that share their tenant and label collection objects (as a read makes them) are
    indexed exactly like pools with a copy each: the same positions, key order and audiences."""
    shared, separate = [], []
    for i, (t, lab, region) in enumerate(rows):
        regions = frozenset({"r1", "r2"} if region else {"r1"})
        shared.append(pool(f"p{i:02d}", tenant_ids=frozenset(tenant_sets[t]),
                           labels=label_sets[lab], artifact_regions=regions))
        # Equal content, new objects, built in another order.
        separate.append(pool(f"p{i:02d}", tenant_ids=frozenset(reversed(tenant_sets[t])),
                             labels=dict(reversed(label_sets[lab].items())),
                             artifact_regions=frozenset(set(regions))))
    for pools in (shared, separate):
        snap = Snapshot.build(pools)
        ps = snap.static_pools
        tenants = list(dict.fromkeys(t for p in ps for t in p.tenant_ids))
        assert list(snap.by_tenant) == tenants
        for t in tenants:
            assert snap.by_tenant[t].tolist() == [i for i, p in enumerate(ps) if t in p.tenant_ids]
        audiences = {t: tuple(snap.by_tenant[t].tolist()) for t in tenants}
        numbers = {a: n for n, a in enumerate(dict.fromkeys(audiences.values()))}
        assert snap.audience == {t: numbers[audiences[t]] for t in tenants}
        labels = list(dict.fromkeys(kv for p in ps for kv in p.labels.items()))
        assert list(snap._label_idx) == labels
        for kv in labels:
            assert snap._label_idx[kv].tolist() == [
                i for i, p in enumerate(ps) if kv in p.labels.items()]
        for r in ("r1", "r2"):
            want = [i for i, p in enumerate(ps) if r in p.artifact_regions]
            assert snap._artifact_idx.get(r, np.zeros(0, dtype=np.intp)).tolist() == want


def test_codes_follow_first_appearance_and_none_gets_minus_one():
    codes, table = snapshot_module._codes(["b", None, "a", "b", None, "c", "a"])
    assert codes.tolist() == [0, -1, 1, 0, -1, 2, 1]
    assert codes.dtype == np.int32
    assert list(table.items()) == [("b", 0), ("a", 1), ("c", 2)]
    empty, none = snapshot_module._codes([])
    assert empty.tolist() == [] and none == {}


def test_pool_states_made_equal_the_constructed_ones():
    pools = [pool("p1", labels={"a": "b"}), pool("p2", capacity=None, heartbeat_fresh=False)]
    fields_of = [tuple(getattr(p, f) for f in PoolState.__slots__) for p in pools]
    made = snapshot_module.pool_states_made(fields_of)
    assert made == pools
    assert all(type(p) is PoolState for p in made)
    assert snapshot_module.pool_states_made([]) == []


_PLACEMENTS = st.lists(
    st.tuples(st.sampled_from(["a", "b"]),
              st.lists(st.integers(0, 5), min_size=1, max_size=3),
              st.one_of(st.none(), st.integers(1, 4)),
              st.sampled_from(["x", "y"])),
    max_size=10,
)


@settings(max_examples=60, deadline=None)
@given(_PLACEMENTS, _PLACEMENTS)
def test_term_and_domain_counts_are_the_members_counted_one_by_one(actual, assumed_ops):
    """Per pool and per failure domain, the counts the affinity terms and the spreading score
    read are the members of the matching placements (actual and assumed), counted one by one,
    with a member count or without."""
    from app.scheduling.cycle import _tenant_domains, _term_table
    from app.scheduling.spec import CompiledTerm

    pools = [pool(f"p{i}", failure_domain=f"f{i % 3}") for i in range(6)]
    placed = [
        PlacedTask(f"t{k}", tenant, {"app": app}, tuple(f"p{i}" for i in at),
                   tuple([members] * len(at)) if members else ())
        for k, (tenant, at, members, app) in enumerate(actual)
    ]
    snap = Snapshot.build(pools, placed)
    overlay = Assumed(snap)
    for k, (tenant, at, members, app) in enumerate(assumed_ops):
        overlay.add(spec(task_id=f"y{k}", tenant=tenant, labels={"app": app}),
                    [(f"p{i}", members or 1) for i in sorted(set(at))])
    dom = [i % 3 for i in range(6)]
    for tenant in ("a", "b"):
        for selector in (None, frozenset({("app", "x")})):
            want_pool = [0] * 6
            for t, at, members, app in actual:
                if t == tenant and (selector is None or app == "x"):
                    for i in at:
                        want_pool[i] += members or 1
            want_domain = [sum(c for i, c in enumerate(want_pool) if dom[i] == d)
                           for d in range(3)]
            if selector is None:
                assert _tenant_domains(snap, tenant, "failureDomain").tolist() == want_domain
                continue
            table, total = _term_table(snap, tenant, selector, "pool")
            assert (table.tolist(), total) == (want_pool, sum(want_pool))
            table, total = _term_table(snap, tenant, selector, "failureDomain")
            assert (table.tolist(), total) == (want_domain, sum(want_domain))
            # The cycle adds this pass's assumed members of the tenant matching the term.
            extra = [0] * 6
            for t, at, members, app in assumed_ops:
                if t == tenant and app == "x":
                    for i in set(at):
                        extra[i] += members or 1
            cycle = Cycle(spec(task_id="z", tenant=tenant), snap, overlay)
            for topology in ("pool", "failureDomain"):
                term = CompiledTerm(selector, topology, False, 1)
                table, codes, total = cycle.term_table(term)
                both = [w + e for w, e in zip(want_pool, extra, strict=True)]
                if topology == "failureDomain":
                    both = [sum(c for i, c in enumerate(both) if dom[i] == d) for d in range(3)]
                assert (table.tolist(), total) == (both, sum(both))
