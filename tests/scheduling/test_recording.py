"""The pass record's serialisation is faithful: decoding what was encoded plans identically,
over generated worlds (pools, placements, tasks, quotas, holds, victims, nominations)."""

from __future__ import annotations

import dataclasses
import uuid
import zlib
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import zstandard
from asyncpg.pgproto import pgproto
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.scheduling.inputs import NominationInputs, PassInputs, PassSettings, ReclaimInputs
from app.scheduling.planner import plan_pass
from app.scheduling.plugins.quota import QuotaRow
from app.scheduling.plugins.registry import profile
from app.scheduling.preemption import Victim
from app.scheduling.recording import (
    RecordFormatError,
    decision_rows,
    decisions_decode,
    decisions_encode,
    decisions_of,
    decisions_packed,
    inputs_decode,
    inputs_differ,
    inputs_encode,
    plan_digest,
    pools_decode,
    pools_encode,
)
from app.scheduling.records import ClaimedTask, Nomination
from app.scheduling.replay import pass_replay
from app.scheduling.snapshot import PoolState, Snapshot
from app.scheduling.spec import StoredSpecs
from tests.scheduling.test_properties import LABELS, TENANTS, worlds

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _json(blob: bytes) -> dict:
    """Return the JSON document of a record part this build wrote (format 4: Zstandard)."""
    return orjson.loads(zstandard.ZstdDecompressor().decompress(blob))


@st.composite
def spec_texts(draw) -> str:
    body = {
        "runtimeClass": draw(st.sampled_from(["py", "node"])),
        "requests": {"cpuMillis": draw(st.sampled_from([500, 1000, 1500])),
                     "memoryMiB": draw(st.sampled_from([0, 500]))},
        "labels": draw(LABELS),
        "priority": draw(st.integers(0, 3)),
        "affinity": {"preferred": draw(st.lists(st.fixed_dictionaries({
            "selector": st.sampled_from([{"app": "x"}, {"tier": "y"}]),
            "topology": st.sampled_from(["pool", "failureDomain"]),
            "anti": st.booleans(), "weight": st.integers(1, 50)}), max_size=1))},
    }
    if draw(st.booleans()):
        body["gang"] = {"members": draw(st.integers(2, 3)), "minPools": 1}
    if draw(st.booleans()):
        body["preemption"] = "lowerPriority"
    return orjson.dumps(body).decode()


@st.composite
def pass_inputs(draw) -> PassInputs:
    pools, placed = draw(worlds())
    snapshot = Snapshot.build(pools, placed, strategy=draw(st.sampled_from(["spread",
                                                                             "binpack"])))
    ids = [p.id for p in pools]
    tasks = []
    for seq in range(draw(st.integers(1, 8))):
        tasks.append(ClaimedTask(
            uuid.UUID(int=draw(st.integers(1, 2**64))), draw(st.sampled_from(TENANTS)), seq,
            draw(st.integers(0, 3)), draw(spec_texts()),
            NOW - timedelta(seconds=draw(st.integers(0, 600))), draw(st.integers(0, 2)),
            pending_code=draw(st.none() | st.just("insufficient_cpu")),
            logged_at=draw(st.none() | st.just(NOW - timedelta(seconds=30)))))
    specs = StoredSpecs(64)
    compiled, invalid = specs.compile_all(tasks)
    rows = tuple(QuotaRow(t, "py", r, "c1", draw(st.integers(0, 4000)), None, None,
                          draw(st.integers(0, 4000)))
                 for t in TENANTS for r in ("cpuMillis", "memoryMiB", "llmSlots")
                 ) if draw(st.booleans()) else ()
    victims = tuple(
        Victim(str(uuid.UUID(int=100 + i)), draw(st.sampled_from(TENANTS)),
               draw(st.integers(0, 2)), 1000.0 + i, (500, 0, 0),
               ((draw(st.sampled_from(ids)), 1),))
        for i in range(draw(st.integers(0, 3))))
    holder = compiled[0][0].id if compiled and draw(st.booleans()) else None
    nomination = NominationInputs(
        (Nomination(ids[0], uuid.UUID(int=7), "py", 1, (500, 0, 0), NOW, 1, 3, "ADMITTED"),),
        {"py": ((uuid.UUID(int=7), 1, 3),)}, {uuid.UUID(int=7): {ids[0]: (100, 0, 0)}},
    ) if draw(st.booleans()) else None
    return PassInputs(
        now=NOW,
        settings=PassSettings(4, draw(st.sampled_from(["fifo", "priority", "fair"])), 60.0,
                              300.0, 100, 30.0, 0.0, draw(st.sampled_from([0.0, 300.0]))),
        profile=profile(snapshot.strategy), snapshot=snapshot, tasks=tuple(compiled),
        invalid=tuple((t, why) for t, why in invalid),
        usage={t: (draw(st.integers(0, 3000)), 0, 0) for t in TENANTS},
        entitlements={"a": (1.0, 2.0, 0.5)} if draw(st.booleans()) else None,
        quota_rows=rows, cohorts={t: "c1" for t in TENANTS} if rows else {},
        holds={holder: {ids[0]: (500, 0, 0)}} if holder else {},
        waiting={uuid.UUID(int=9): (2, NOW + timedelta(seconds=30))},
        victims=victims,
        reclaim=ReclaimInputs(frozenset({uuid.UUID(int=11)}), {("a", "py"): (500, 0, 0)},
                              victims, 900.0) if rows else None,
        nomination=nomination,
    )


def _round_trip(inputs: PassInputs) -> PassInputs:
    digest, pools = pools_encode(inputs.snapshot)
    static = pools_decode(pools)
    return inputs_decode(inputs_encode(inputs), static, specs=StoredSpecs(64)).inputs


@SETTINGS
@given(pass_inputs())
def test_decoded_inputs_plan_identically(inputs: PassInputs) -> None:
    decoded = _round_trip(inputs)
    plan, again = plan_pass(inputs), plan_pass(decoded)
    assert decisions_of(again) == decisions_of(plan)
    assert plan_digest(again) == plan_digest(plan)
    assert inputs_differ(inputs_encode(inputs), decoded) == []


@SETTINGS
@given(pass_inputs())
def test_decisions_survive_their_encoding(inputs: PassInputs) -> None:
    plan = plan_pass(inputs)
    assert decisions_decode(decisions_encode(decision_rows(plan))) == decisions_of(plan)
    digest, blob = decisions_packed(plan)
    assert digest == plan_digest(plan) and blob == decisions_encode(decision_rows(plan))


def _format_1(blob: bytes) -> bytes:
    """Return a record's inputs as format 1 wrote them: each claimed task one list of its
    fields, each invalid one a pair of that list and why."""
    doc = _json(blob)

    def rows(columns: dict) -> list:
        return [list(row) for row in zip(*columns.values(), strict=True)] if columns else []

    doc.update(format=1, tasks=rows(doc["tasks"]),
               invalid=[[row, why] for row, why in
                        zip(rows(doc["invalid"]), doc.pop("invalidWhy"), strict=True)])
    return zlib.compress(orjson.dumps(doc))


@SETTINGS
@given(pass_inputs())
def test_a_record_of_format_1_decodes_and_plans_identically(inputs: PassInputs) -> None:
    bad = ClaimedTask(uuid.UUID(int=5), "a", 99, 0, '{"requests": 1}', NOW, 0)
    inputs = dataclasses.replace(inputs, invalid=(*inputs.invalid, (bad, "not a spec")))
    blob = _format_1(inputs_encode(inputs))
    _, pools = pools_encode(inputs.snapshot)
    decoded = inputs_decode(blob, pools_decode(pools), specs=StoredSpecs(64)).inputs
    assert decoded.tasks == inputs.tasks and decoded.invalid == inputs.invalid
    assert decisions_of(plan_pass(decoded)) == decisions_of(plan_pass(inputs))
    assert inputs_differ(blob, decoded) == []


def test_a_record_of_another_format_is_refused() -> None:
    blob = zlib.compress(orjson.dumps({"format": 99, "pools": []}))
    with pytest.raises(RecordFormatError, match="format 99"):
        pools_decode(blob)


def _usage_changed(inputs: PassInputs, draw) -> PassInputs:
    """Return ``inputs`` over a snapshot derived from its own: some pools' ledger totals,
    ledger presence, reservations and heartbeat freshness changed since the static build."""
    snap = inputs.snapshot
    n = snap.n
    pick = draw(st.lists(st.integers(0, n - 1), max_size=n))
    cap, has_ledger = snap.cap.copy(), snap.has_ledger.copy()
    reserved, fresh = snap.reserved.copy(), snap.fresh.copy()
    for i in pick:
        cap[i] = (draw(st.integers(0, 4000)), draw(st.integers(0, 4000)), 0)
        has_ledger[i] = draw(st.booleans())
        reserved[i] = (draw(st.integers(0, 2000)), 0, 0)
        fresh[i] = draw(st.booleans())
    derived = snap.with_arrays(cap=cap, has_ledger=has_ledger, reserved=reserved, fresh=fresh,
                               placed=[])
    return dataclasses.replace(inputs, snapshot=derived)


@SETTINGS
@given(pass_inputs(), st.data())
def test_pools_changed_since_the_static_build_decode_and_plan_identically(
    inputs: PassInputs, data: st.DataObject
) -> None:
    inputs = _usage_changed(inputs, data.draw)
    _decoded_identically(inputs, _round_trip(inputs), inputs_encode(inputs))


def _decoded_identically(inputs: PassInputs, decoded: PassInputs, blob: bytes) -> None:
    """Assert that ``decoded`` (from ``blob``) has the arrays of ``inputs`` and plans as it."""
    for name in ("cap", "has_ledger", "reserved", "fresh"):
        assert (getattr(decoded.snapshot, name) == getattr(inputs.snapshot, name)).all(), name
    assert decisions_of(plan_pass(decoded)) == decisions_of(plan_pass(inputs))
    assert inputs_differ(blob, decoded) == []


def _format_2(inputs: PassInputs) -> tuple[bytes, bytes]:
    """Return the static pools and inputs of ``inputs`` as format 2 wrote them: each pool
    with its tenants and without ledger totals or freshness, every pool's four arrays."""
    snap = inputs.snapshot
    pools = [[p.id, sorted(p.tenant_ids), p.runtime_class, p.runtime_instance_id, p.region,
              p.data_residency, p.failure_domain, list(p.labels.items()),
              sorted(p.artifact_regions), p.cost_weight, p.status, p.ready]
             for p in snap.static_pools]
    doc = _json(inputs_encode(inputs))
    del doc["reserved"], doc["poolsChanged"]
    doc.update(format=2, arrays=[snap.cap.tolist(), snap.has_ledger.tolist(),
                                 snap.reserved.tolist(), snap.fresh.tolist()])
    return (zlib.compress(orjson.dumps({"format": 2, "pools": pools})),
            zlib.compress(orjson.dumps(doc)))


@SETTINGS
@given(pass_inputs(), st.data())
def test_a_record_of_format_2_decodes_and_plans_identically(
    inputs: PassInputs, data: st.DataObject
) -> None:
    inputs = _usage_changed(inputs, data.draw)
    pools, blob = _format_2(inputs)
    decoded = inputs_decode(blob, pools_decode(pools), specs=StoredSpecs(64)).inputs
    _decoded_identically(inputs, decoded, blob)


def test_pools_of_a_tenant_group_share_one_written_set() -> None:
    snap = Snapshot.build([
        dataclasses.replace(p, tenant_ids=frozenset(tenants))
        for p, tenants in zip(
            (PoolState(f"p{i}", frozenset(), "py") for i in range(4)),
            (["a", "b"], ["b", "a"], ["c"], ["a", "b"]), strict=True)
    ])
    _, blob = pools_encode(snap)
    doc = _json(blob)["pools"]
    assert doc["tenantSets"] == [["a", "b"], ["c"]]
    assert [row[1] for row in doc["pools"]] == [0, 0, 1, 0]
    assert [p.tenant_ids for p in pools_decode(blob)] == [
        frozenset("ab"), frozenset("ab"), frozenset("c"), frozenset("ab")]


def _format_3(blob: bytes) -> bytes:
    """Return a record part as format 3 wrote it: the same JSON, compressed with zlib."""
    return zlib.compress(orjson.dumps({**_json(blob), "format": 3}), 1)


def _replayed_identically(inputs: PassInputs, pools: bytes, blob: bytes,
                          decisions: bytes, digest: str) -> None:
    decoded = inputs_decode(blob, pools_decode(pools), specs=StoredSpecs(64)).inputs
    assert inputs_differ(blob, decoded) == []
    committed = decisions_decode(decisions)
    assert committed == decisions_of(plan_pass(inputs))
    replay = pass_replay("p", decoded, committed, digest)
    assert replay.changes == [] and replay.plan_identical
    assert replay.replayed == committed


@SETTINGS
@given(pass_inputs(), st.data())
def test_a_record_of_format_3_decodes_and_replays_identically(
    inputs: PassInputs, data: st.DataObject
) -> None:
    inputs = _usage_changed(inputs, data.draw)
    _, pools = pools_encode(inputs.snapshot)
    digest, decisions = decisions_packed(plan_pass(inputs))
    old = [_format_3(b) for b in (pools, inputs_encode(inputs), decisions)]
    assert all(zlib.decompress(b) for b in old)
    _replayed_identically(inputs, *old, digest)


@SETTINGS
@given(pass_inputs())
def test_a_record_of_format_4_is_zstandard_and_replays_identically(
    inputs: PassInputs
) -> None:
    _, pools = pools_encode(inputs.snapshot)
    digest, decisions = decisions_packed(plan_pass(inputs))
    blob = inputs_encode(inputs)
    for part in (pools, blob, decisions):
        assert part[:4] == b"\x28\xb5\x2f\xfd" and _json(part)["format"] == 4
    _replayed_identically(inputs, pools, blob, decisions, digest)


@SETTINGS
@given(pass_inputs(), st.booleans())
def test_decisions_are_written_as_they_always_were(inputs: PassInputs, claimed: bool) -> None:
    """The decisions' JSON (and so the plan digest a replay compares with the recorded one)
    is the same as the rows of text ids and lists that formats 1 to 3 wrote, whether the
    task ids are ``uuid.UUID`` (decoded records) or asyncpg's UUID (claimed tasks)."""
    if claimed:
        inputs = dataclasses.replace(inputs, tasks=tuple(
            (t._replace(id=pgproto.UUID(str(t.id))), spec) for t, spec in inputs.tasks))
    plan = plan_pass(inputs)
    rows = []
    for p in plan.placed:
        placement = p.result.placement
        assert placement is not None
        rows.append([str(p.task.id), placement.pool_id, float(placement.score),
                     [[c.name, float(c.value)] for c in placement.components],
                     [list(m) for m in p.members], None])
    rows += [[str(u.task_id), None, None, [], [], u.reason] for u in plan.unclaims]
    assert orjson.dumps(decision_rows(plan)) == orjson.dumps(rows)
    assert plan_digest(plan) == plan_digest(plan, rows)
    assert plan_digest(plan) == decisions_packed(plan)[0]
