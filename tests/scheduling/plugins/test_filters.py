"""One parametrized table per filter plugin: a pool and a spec in, a status out."""

from __future__ import annotations

import pytest

from app.scheduling.assumed import Assumed
from app.scheduling.cycle import Cycle
from app.scheduling.plugins.capacity import Capacity
from app.scheduling.plugins.data_residency import DataResidency
from app.scheduling.plugins.health import Health
from app.scheduling.plugins.pool_selector import PoolSelector
from app.scheduling.plugins.pool_status import PoolStatus
from app.scheduling.plugins.region import Region
from app.scheduling.plugins.required_affinity import RequiredAffinity
from app.scheduling.plugins.runtime_class import RuntimeClass
from app.scheduling.plugins.tenant_access import TenantAccess
from app.scheduling.reasons import Reason

from ..factories import placed, pool, snapshot, spec


def verdict(plugin, pool_state, compiled, placements=(), assumed_on=None):
    """Return the status of ``plugin`` on a one-pool snapshot (plus a neighbour pool)."""
    snap = snapshot(
        [pool_state, pool("zz-other", failure_domain="fd9", region="r9")], list(placements)
    )
    assumed = None
    if assumed_on is not None:
        assumed = Assumed(snap)
        other = spec(task_id="assumed", labels=assumed_on[1])
        assumed.add(other, [(assumed_on[0], 1)])
    cycle = Cycle(compiled, snap, assumed)
    return plugin.filter(cycle, snap.pos[pool_state.id]).reason


@pytest.mark.parametrize(
    "tenants,tenant,expected",
    [
        pytest.param({"acme"}, "acme", None, id="listed"),
        pytest.param({"acme", "beta"}, "beta", None, id="shared-pool"),
        pytest.param({"beta"}, "acme", Reason.TENANT_NOT_ALLOWED, id="not-listed"),
        pytest.param(set(), "acme", Reason.TENANT_NOT_ALLOWED, id="nobody"),
    ],
)
def test_tenant_access(tenants, tenant, expected):
    assert verdict(TenantAccess(), pool("p", tenant_ids=tenants), spec(tenant=tenant)) == expected


@pytest.mark.parametrize(
    "status,expected",
    [
        pytest.param("ACTIVE", None, id="active"),
        pytest.param("CORDONED", Reason.POOL_NOT_ACTIVE, id="cordoned"),
        pytest.param("DRAINING", Reason.POOL_NOT_ACTIVE, id="draining"),
    ],
)
def test_pool_status(status, expected):
    assert verdict(PoolStatus(), pool("p", status=status), spec()) == expected


@pytest.mark.parametrize(
    "fields,expected",
    [
        pytest.param({}, None, id="healthy"),
        pytest.param({"ready": False}, Reason.POOL_NOT_READY, id="not-ready"),
        pytest.param({"heartbeat_fresh": False}, Reason.RUNTIME_UNHEALTHY, id="stale-heartbeat"),
        pytest.param({"capacity": None}, Reason.LEDGER_MISSING, id="no-ledger"),
        pytest.param(
            {"ready": False, "heartbeat_fresh": False, "capacity": None},
            Reason.POOL_NOT_READY,
            id="all-bad-first-wins",
        ),
        pytest.param(
            {"heartbeat_fresh": False, "capacity": None},
            Reason.RUNTIME_UNHEALTHY,
            id="heartbeat-before-ledger",
        ),
    ],
)
def test_health(fields, expected):
    assert verdict(Health(), pool("p", **fields), spec()) == expected


@pytest.mark.parametrize(
    "pool_class,spec_class,expected",
    [
        pytest.param("py", "py", None, id="same"),
        pytest.param("node", "py", Reason.RUNTIME_CLASS_MISMATCH, id="other"),
        pytest.param("py", "unknown-class", Reason.RUNTIME_CLASS_MISMATCH, id="class-nowhere"),
    ],
)
def test_runtime_class(pool_class, spec_class, expected):
    s = spec(runtimeClass=spec_class)
    assert verdict(RuntimeClass(), pool("p", runtime_class=pool_class), s) == expected


@pytest.mark.parametrize(
    "region,allowed,expected",
    [
        pytest.param("r1", None, None, id="unconstrained"),
        pytest.param("r1", ["r1"], None, id="allowed"),
        pytest.param("r1", ["r2", "r1"], None, id="one-of-several"),
        pytest.param("r1", ["r2"], Reason.REGION_NOT_ALLOWED, id="not-allowed"),
        pytest.param("r1", ["nowhere"], Reason.REGION_NOT_ALLOWED, id="unknown-region"),
    ],
)
def test_region(region, allowed, expected):
    s = spec(constraints={"regions": allowed}) if allowed else spec()
    assert verdict(Region(), pool("p", region=region), s) == expected


@pytest.mark.parametrize(
    "residency,wanted,expected",
    [
        pytest.param("eu", None, None, id="unconstrained"),
        pytest.param("eu", "eu", None, id="match"),
        pytest.param("us", "eu", Reason.RESIDENCY_MISMATCH, id="mismatch"),
        pytest.param(None, "eu", Reason.RESIDENCY_MISMATCH, id="pool-without-residency"),
    ],
)
def test_data_residency(residency, wanted, expected):
    s = spec(constraints={"dataResidency": wanted}) if wanted else spec()
    assert verdict(DataResidency(), pool("p", data_residency=residency), s) == expected


@pytest.mark.parametrize(
    "labels,selector,expected",
    [
        pytest.param({}, {}, None, id="no-selector"),
        pytest.param({"gpu": "a100"}, {"gpu": "a100"}, None, id="match"),
        pytest.param({"gpu": "a100", "x": "y"}, {"gpu": "a100"}, None, id="superset"),
        pytest.param({"gpu": "t4"}, {"gpu": "a100"}, Reason.SELECTOR_MISMATCH, id="other-value"),
        pytest.param({}, {"gpu": "a100"}, Reason.SELECTOR_MISMATCH, id="missing-key"),
        pytest.param(
            {"gpu": "a100"},
            {"gpu": "a100", "zone": "a"},
            Reason.SELECTOR_MISMATCH,
            id="partial-match",
        ),
    ],
)
def test_pool_selector(labels, selector, expected):
    s = spec(constraints={"poolSelector": selector})
    assert verdict(PoolSelector(), pool("p", labels=labels), s) == expected


@pytest.mark.parametrize(
    "capacity,reserved,requests,expected",
    [
        pytest.param((4000, 8192, 4), (0, 0, 0), (1000, 0, 0), None, id="fits"),
        pytest.param((4000, 8192, 4), (3000, 0, 0), (1000, 0, 0), None, id="exactly-full"),
        pytest.param(
            (4000, 8192, 4), (3001, 0, 0), (1000, 0, 0), Reason.INSUFFICIENT_CPU, id="cpu"
        ),
        pytest.param(
            (4000, 8192, 4), (0, 8000, 0), (0, 200, 0), Reason.INSUFFICIENT_MEMORY, id="memory"
        ),
        pytest.param(
            (4000, 8192, 0), (0, 0, 0), (0, 0, 1), Reason.INSUFFICIENT_LLM_SLOTS, id="llm-slots"
        ),
        pytest.param(
            (100, 100, 0),
            (0, 0, 0),
            (1000, 1000, 1),
            Reason.INSUFFICIENT_CPU,
            id="cpu-reported-first",
        ),
        pytest.param((0, 0, 4), (0, 0, 0), (0, 0, 4), None, id="zero-dims-not-requested"),
    ],
)
def test_capacity(capacity, reserved, requests, expected):
    cpu, mem, llm = requests
    s = spec(requests={"cpuMillis": cpu, "memoryMiB": mem, "llmSlots": llm})
    assert verdict(Capacity(), pool("p", capacity=capacity, reserved=reserved), s) == expected


def test_capacity_counts_assumed_usage():
    s = spec(requests={"cpuMillis": 3000})
    # One assumed 1-cpu task on p leaves 3000: fits; the 3000 then leaves nothing.
    assert verdict(Capacity(), pool("p"), s, assumed_on=("p", {})) is None
    big = spec(requests={"cpuMillis": 3500})
    assert verdict(Capacity(), pool("p"), big, assumed_on=("p", {})) == Reason.INSUFFICIENT_CPU


REQ = [{"selector": {"app": "db"}, "topology": "pool"}]
ANTI = [{"selector": {"app": "db"}, "topology": "failureDomain", "anti": True}]


@pytest.mark.parametrize(
    "required,labels,placements,assumed_on,expected",
    [
        pytest.param([], {}, [], None, None, id="no-terms"),
        pytest.param(REQ, {}, [("x", "p")], None, None, id="match-on-pool"),
        pytest.param(
            REQ, {}, [("x", "zz-other")], None, Reason.AFFINITY_UNSATISFIED, id="match-elsewhere"
        ),
        pytest.param(REQ, {}, [], None, Reason.AFFINITY_UNSATISFIED, id="no-match-no-bootstrap"),
        pytest.param(REQ, {"app": "db"}, [], None, None, id="bootstrap-own-labels"),
        pytest.param(
            REQ,
            {"app": "db"},
            [("x", "zz-other")],
            None,
            Reason.AFFINITY_UNSATISFIED,
            id="no-bootstrap-once-a-match-exists",
        ),
        pytest.param(REQ, {}, [], ("p", {"app": "db"}), None, id="assumed-match"),
        pytest.param(
            [{"selector": {"app": "db"}, "topology": "region"}],
            {},
            [("x", "zz-other")],
            None,
            Reason.AFFINITY_UNSATISFIED,
            id="region-topology-other-region",
        ),
        pytest.param(ANTI, {}, [], None, None, id="anti-nothing-placed"),
        pytest.param(
            ANTI, {}, [("x", "p")], None, Reason.ANTI_AFFINITY_VIOLATED, id="anti-same-pool"
        ),
        pytest.param(ANTI, {}, [("x", "zz-other")], None, None, id="anti-other-domain"),
        pytest.param(
            ANTI, {}, [], ("p", {"app": "db"}), Reason.ANTI_AFFINITY_VIOLATED, id="anti-assumed"
        ),
    ],
)
def test_required_affinity(required, labels, placements, assumed_on, expected):
    s = spec(affinity={"required": required}, labels=labels)
    ps = [placed(t, p, app="db") for t, p in placements]
    assert verdict(RequiredAffinity(), pool("p"), s, ps, assumed_on) == expected


def test_required_affinity_ignores_other_tenants_placements():
    s = spec(affinity={"required": REQ})
    ps = [placed("x", "p", tenant="beta", app="db")]
    assert verdict(RequiredAffinity(), pool("p"), s, ps) == Reason.AFFINITY_UNSATISFIED


def test_required_affinity_failure_domain_topology():
    s = spec(affinity={"required": [{"selector": {"app": "db"}, "topology": "failureDomain"}]})
    snap = snapshot(
        [
            pool("a", failure_domain="f1"),
            pool("b", failure_domain="f1"),
            pool("c", failure_domain="f2"),
        ],
        [placed("x", "a", app="db")],
    )
    cycle = Cycle(s, snap, None)
    got = [RequiredAffinity().filter(cycle, snap.pos[p]).reason for p in "abc"]
    assert got == [None, None, Reason.AFFINITY_UNSATISFIED]
