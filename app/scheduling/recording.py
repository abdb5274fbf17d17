"""A pass's record: its :class:`~app.scheduling.inputs.PassInputs` and what its plan decided,
as compact, compressed, versioned bytes.

A record has three parts:

* **pools** (:func:`pools_encode`): the static part of the snapshot (each pool's identity,
  placement keys, cost, status and readiness, and the ledger totals and heartbeat freshness
  it was built with). Passes share it while no pool row changes, so it is stored once under
  its digest and the records name it;
* **inputs** (:func:`inputs_encode`): everything else the planner reads: the reservations
  array, the pools whose ledger totals or heartbeat freshness differ from their static part's
  (most passes: none), the placements affinity reads, the claimed tasks with their stored
  spec texts (each distinct text once; the tasks as columns, one list per field), the quota
  rows, holds, displacements under way, victims, nominations, the profile and settings that
  decide, and the pass clock;
* **decisions** (:func:`decisions_of`): per task, the pool(s), score and score components
  of its placement, or the code it was handed back with, and a digest of the whole plan.

Every part is JSON (mappings as lists of pairs, so key types and order survive) compressed,
and starts with its format version. This build writes format 4 and reads formats 1 to 4.
Format 4 compresses with Zstandard (level 1), formats 1 to 3 did with zlib (level 1), which
takes more CPU and more bytes; a record's first bytes say which it is. Format 1 wrote each
claimed task as one list of its fields, formats 2 to 4 write the tasks as columns. Formats 1
and 2 wrote the pools without their ledger totals and freshness, each with its tenants, and
the inputs with every pool's ledger totals, ledger presence, reservations and freshness;
formats 3 and 4 write each distinct set of tenants once (a pool names it by position), and
the inputs with the reservations and only the pools whose other arrays changed since the
static part was built. The decisions are the same in all four. A version this build does not
know is refused. Decoding recompiles the stored spec texts with this build's compiler and
rebuilds the snapshot from the pools and arrays, so the planner sees what it saw (a
round-trip test holds this: ``decode(encode(x))`` plans as ``x``).
"""

from __future__ import annotations

import hashlib
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import zstandard

from app.scheduling.inputs import NominationInputs, PassInputs, PassSettings, ReclaimInputs
from app.scheduling.planner import PassPlan
from app.scheduling.plugins.quota import CohortRow, QuotaRow
from app.scheduling.preemption import Victim
from app.scheduling.profiles import plugins_document, profile_from_plugins
from app.scheduling.records import ClaimedTask, Nomination
from app.scheduling.results import Ranked
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import StoredSpecs

__all__ = [
    "FORMAT",
    "Decision",
    "RecordFormatError",
    "decisions_decode",
    "decisions_encode",
    "decision_from_row",
    "decision_rows",
    "decisions_of",
    "decisions_packed",
    "inputs_decode",
    "inputs_differ",
    "inputs_encode",
    "plan_digest",
    "pools_decode",
    "pools_encode",
]

#: The version of the record format this build writes.
FORMAT = 4
#: The versions it reads.
FORMATS_READ = (1, 2, 3, 4)
_LEVEL = 1
_OPTS = orjson.OPT_SERIALIZE_NUMPY
_UUID = uuid.UUID
#: The first bytes of a Zstandard frame (format 4); formats 1 to 3 are zlib streams, whose
#: first two bytes never are these.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class RecordFormatError(ValueError):
    """The record was written in a format this build does not read."""


# Zstandard's one-shot functions make a context per call (safe from any thread: replays
# decode and encode in worker threads); a pass packs three parts, some 15 us of contexts.
def _pack(doc: dict[str, Any]) -> bytes:
    return zstandard.compress(orjson.dumps({"format": FORMAT, **doc}, option=_OPTS), _LEVEL)


def _unpack(blob: bytes) -> dict[str, Any]:
    raw = zstandard.decompress(blob) if blob[:4] == _ZSTD_MAGIC else zlib.decompress(blob)
    doc = orjson.loads(raw)
    if doc.get("format") not in FORMATS_READ:
        raise RecordFormatError(
            f"record format {doc.get('format')!r} is not one this build reads "
            f"({', '.join(map(str, FORMATS_READ))})")
    return doc


def _t(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _at(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _vec(v: Any) -> tuple[int, int, int]:
    return (int(v[0]), int(v[1]), int(v[2]))


# --- pools: the static part of the snapshot ---------------------------------------------------


def pools_encode(snapshot: Snapshot) -> tuple[str, bytes]:
    """Return the digest and bytes of the static part of ``snapshot``'s pools."""
    # Pools share a few sets of tenants (their groups'): each set is sorted and written
    # once, and a pool names it by its position.
    sets: dict[frozenset[str], int] = {}
    index = sets.setdefault
    rows = [
        [p.id, index(p.tenant_ids, len(sets)), p.runtime_class, p.runtime_instance_id,
         p.region, p.data_residency, p.failure_domain, list(p.labels.items()),
         sorted(p.artifact_regions), p.cost_weight, p.status, p.ready, p.heartbeat_fresh,
         p.capacity]
        for p in snapshot.static_pools
    ]
    raw = orjson.dumps({"tenantSets": [sorted(t) for t in sets], "pools": rows})
    digest = hashlib.sha256(raw).hexdigest()[:32]
    return digest, _pack({"pools": orjson.Fragment(raw)})


def pools_decode(blob: bytes) -> tuple[PoolState, ...]:
    """Return the pool states (without reservations) of :func:`pools_encode`'s bytes."""
    doc = _unpack(blob)
    if doc["format"] < 3:
        return tuple(
            PoolState(pid, frozenset(tenants), rc, instance, region, residency, fd,
                      dict(labels), frozenset(artifacts), cost, status, ready)
            for (pid, tenants, rc, instance, region, residency, fd, labels, artifacts, cost,
                 status, ready) in doc["pools"]
        )
    sets = [frozenset(t) for t in doc["pools"]["tenantSets"]]
    return tuple(
        PoolState(pid, sets[tenants], rc, instance, region, residency, fd, dict(labels),
                  frozenset(artifacts), cost, status, ready, fresh,
                  None if capacity is None else _vec(capacity))
        for (pid, tenants, rc, instance, region, residency, fd, labels, artifacts, cost,
             status, ready, fresh, capacity) in doc["pools"]["pools"]
    )


# --- inputs ----------------------------------------------------------------------------------


#: The columns of the claimed tasks (format 2), in :class:`ClaimedTask`'s field order.
_TASK_COLUMNS = ("id", "tenant", "seq", "priority", "text", "admittedAt", "attempts",
                 "pendingCode", "pendingJson", "pendingStage", "loggedCode", "loggedAt",
                 "loggedCount")


def _tasks(tasks: list[ClaimedTask], texts: dict[str, int]) -> dict[str, Sequence[Any]]:
    """Return ``tasks`` as columns (each spec text as its index in ``texts``, added there)."""
    if not tasks:
        return {}
    (ids, tenants, seqs, priorities, specs, admitted, attempts, codes, pending, stages,
     logged, logged_at, counts) = zip(*tasks, strict=True)
    add = texts.setdefault
    # orjson writes a datetime as isoformat() does, several times faster.
    return dict(zip(_TASK_COLUMNS, (
        [u.hex for u in ids], tenants, seqs, priorities, [add(t, len(texts)) for t in specs],
        admitted, attempts, codes, pending, stages, logged, logged_at, counts), strict=True))


def _tasks_decode(
    doc: dict[str, Any],
) -> tuple[list[ClaimedTask], list[tuple[ClaimedTask, str]]]:
    """Return the claimed tasks of a record's inputs (either format), and the invalid ones
    with why."""
    texts = doc["texts"]
    if doc["format"] == 1:
        return ([_task_decode(row, texts) for row in doc["tasks"]],
                [(_task_decode(row, texts), why) for row, why in doc["invalid"]])
    return (_tasks_rows(doc["tasks"], texts),
            list(zip(_tasks_rows(doc["invalid"], texts), doc["invalidWhy"], strict=True)))


def _tasks_rows(columns: dict[str, list[Any]], texts: list[str]) -> list[ClaimedTask]:
    if not columns:
        return []
    return [_task_decode(row, texts)
            for row in zip(*(columns[c] for c in _TASK_COLUMNS), strict=True)]


def _task_decode(row: Sequence[Any], texts: list[str]) -> ClaimedTask:
    (tid, tenant, seq, priority, text, admitted, attempts, code, pending, stage, logged,
     logged_at, count) = row
    admitted_at = _at(admitted)
    assert admitted_at is not None
    return ClaimedTask(uuid.UUID(tid), tenant, seq, priority, texts[text], admitted_at,
                       attempts, code, pending, stage, logged, _at(logged_at), count)


def _victim(v: Victim) -> list[Any]:
    return [v.task_id, v.tenant_id, v.priority, v.leased_at, list(v.requests),
            [list(m) for m in v.members]]


def _victim_decode(row: list[Any]) -> Victim:
    tid, tenant, priority, leased_at, requests, members = row
    return Victim(tid, tenant, priority, leased_at, _vec(requests),
                  tuple((p, c) for p, c in members))


def _placed(snapshot: Snapshot) -> list[Any]:
    out = []
    for tenant, labels, idx, weights in snapshot.placed_entries():
        out.append([tenant, sorted(labels), idx,
                    None if isinstance(weights, int) else weights])
    return out


def _placed_decode(rows: list[Any], ids: tuple[str, ...]) -> list[PlacedTask]:
    return [
        PlacedTask(str(n), tenant, dict(labels), tuple(ids[i] for i in idx),
                   tuple(weights) if weights is not None else ())
        for n, (tenant, labels, idx, weights) in enumerate(rows)
    ]


def _settings(s: PassSettings) -> list[Any]:
    return [s.top_k, s.policy, s.priority_aging_seconds, s.park_sweep_seconds,
            s.task_events_kept, s.preemption_grace_seconds, s.reclaim_min_runtime_seconds,
            s.nomination_seconds, s.fair_usage_half_life_seconds]


def _reclaim(r: ReclaimInputs | None) -> list[Any] | None:
    if r is None:
        return None
    return [sorted(t.hex for t in r.waiting),
            [[list(k), list(v)] for k, v in r.revoking.items()],
            [_victim(v) for v in r.victims], r.leased_before]


def _reclaim_decode(row: list[Any] | None) -> ReclaimInputs | None:
    if row is None:
        return None
    waiting, revoking, victims, leased_before = row
    return ReclaimInputs(frozenset(uuid.UUID(t) for t in waiting),
                         {(k[0], k[1]): _vec(v) for k, v in revoking},
                         tuple(_victim_decode(v) for v in victims), leased_before)


def _nomination(n: NominationInputs | None) -> list[Any] | None:
    if n is None:
        return None
    return [
        [[x.pool_id, x.task_id.hex, x.runtime_class, x.members, list(x.need),
          _t(x.created_at), x.priority, x.seq, x.state] for x in n.nominations],
        [[rc, [[t.hex, p, s] for t, p, s in heads]] for rc, heads in n.heads.items()],
        [[t.hex, [[p, list(v)] for p, v in pools.items()]] for t, pools in n.lower.items()],
    ]


def _nomination_decode(row: list[Any] | None) -> NominationInputs | None:
    if row is None:
        return None
    nominations, heads, lower = row
    return NominationInputs(
        tuple(Nomination(p, uuid.UUID(t), rc, m, _vec(need), _at(at) or datetime.min, pr, s,
                         state)
              for p, t, rc, m, need, at, pr, s, state in nominations),
        {rc: tuple((uuid.UUID(t), p, s) for t, p, s in hs) for rc, hs in heads},
        {uuid.UUID(t): {p: _vec(v) for p, v in pools} for t, pools in lower},
    )


def _pools_changed(snap: Snapshot) -> list[Any]:
    """Return the pools whose ledger totals, ledger presence or heartbeat freshness differ
    from those their static part was built with: their indexes and those three columns."""
    cap, has_ledger, _, fresh = snap.built_usage()
    changed = np.flatnonzero(
        (snap.cap != cap).any(axis=1) | (snap.has_ledger != has_ledger) | (snap.fresh != fresh))
    return [changed, snap.cap[changed], snap.has_ledger[changed], snap.fresh[changed]]


def _arrays_decode(
    doc: dict[str, Any], built: Snapshot
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return the ledger totals, ledger presence, reservations and freshness of a record's
    inputs (either layout) over the snapshot ``built`` of its static pools."""
    n = built.n
    if "arrays" in doc:
        cap, has_ledger, reserved, fresh = doc["arrays"]
        return (np.array(cap, dtype=np.int64).reshape(n, 3),
                np.array(has_ledger, dtype=bool).reshape(n),
                np.array(reserved, dtype=np.int64).reshape(n, 3),
                np.array(fresh, dtype=bool).reshape(n))
    base_cap, base_ledger, _, base_fresh = built.built_usage()
    cap, has_ledger, fresh = base_cap.copy(), base_ledger.copy(), base_fresh.copy()
    idx, changed_cap, changed_ledger, changed_fresh = doc["poolsChanged"]
    if idx:
        cap[idx] = np.array(changed_cap, dtype=np.int64).reshape(len(idx), 3)
        has_ledger[idx] = changed_ledger
        fresh[idx] = changed_fresh
    return cap, has_ledger, np.array(doc["reserved"], dtype=np.int64).reshape(n, 3), fresh


def inputs_encode(inputs: PassInputs) -> bytes:
    """Return the bytes of ``inputs`` but the static pools (see :func:`pools_encode`)."""
    snap = inputs.snapshot
    texts: dict[str, int] = {}
    tasks = _tasks([t for t, _ in inputs.tasks], texts)
    invalid = _tasks([t for t, _ in inputs.invalid], texts)
    doc = {
        "now": _t(inputs.now),
        "settings": _settings(inputs.settings),
        "profile": plugins_document(inputs.profile, snap.strategy),
        "strategy": snap.strategy,
        "reserved": snap.reserved,
        "poolsChanged": _pools_changed(snap),
        "placed": _placed(snap),
        "texts": list(texts),
        "tasks": tasks,
        "invalid": invalid,
        "invalidWhy": [why for _, why in inputs.invalid],
        "usage": [[k, list(v)] for k, v in inputs.usage.items()],
        "entitlements": None if inputs.entitlements is None else [
            [k, list(v)] for k, v in inputs.entitlements.items()],
        "quotaRows": [[r.tenant_id, r.runtime_class, r.resource, r.cohort, r.nominal, r.cap,
                       r.lend, r.used] for r in inputs.quota_rows],
        "cohorts": list(inputs.cohorts.items()),
        "quotaCohorts": [[c.cohort, c.runtime_class, c.resource, c.parent, c.nominal, c.cap,
                          c.lend, c.lim, c.used, c.weight] for c in inputs.quota_cohorts],
        "tenantWeights": list(inputs.tenant_weights.items()),
        "fairUsage": None if inputs.fair_usage is None else [
            [list(k), list(v)] for k, v in inputs.fair_usage.items()],
        "holds": [[t.hex, [[p, list(v)] for p, v in pools.items()]]
                  for t, pools in inputs.holds.items()],
        "waiting": [[t.hex, n, _t(by)] for t, (n, by) in inputs.waiting.items()],
        "victims": [_victim(v) for v in inputs.victims],
        "reclaim": _reclaim(inputs.reclaim),
        "nomination": _nomination(inputs.nomination),
    }
    return _pack(doc)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A decoded record's inputs, with the plugin part of the profile they were planned
    under."""

    inputs: PassInputs
    profile: Mapping[str, Any]


def inputs_decode(
    blob: bytes, pools: tuple[PoolState, ...], *, specs: StoredSpecs,
    base: Callable[[str], Snapshot] | None = None, strategy: str | None = None,
) -> Recorded:
    """Return the inputs recorded in ``blob`` over the static ``pools``.

    ``specs`` compiles the stored spec texts (with this build's compiler),
    ``base(strategy)``, when given, returns the snapshot of ``pools`` built for that
    strategy (to share it between records), and ``strategy`` builds the snapshot for
    another strategy than the recorded one (a what-if).
    """
    doc = _unpack(blob)
    strategy = strategy or doc["strategy"]
    built = base(strategy) if base is not None else Snapshot.build(pools, strategy=strategy)
    cap, has_ledger, reserved, fresh = _arrays_decode(doc, built)
    snapshot = built.with_arrays(cap=cap, has_ledger=has_ledger, reserved=reserved,
                                 fresh=fresh, placed=_placed_decode(doc["placed"], built.ids))
    claimed, invalid = _tasks_decode(doc)
    compiled, failed = specs.compile_all(claimed)
    if failed:
        raise RecordFormatError(f"{len(failed)} recorded specs no longer compile: "
                                f"{failed[0][1]}")
    settings = PassSettings(*doc["settings"])
    entitlements = doc["entitlements"]
    fair_usage = doc.get("fairUsage")
    inputs = PassInputs(
        now=_at(doc["now"]) or datetime.min, settings=settings,
        profile=profile_from_plugins(doc["profile"]), snapshot=snapshot, tasks=tuple(compiled),
        invalid=tuple(invalid),
        usage={k: _vec(v) for k, v in doc["usage"]},
        entitlements=None if entitlements is None else {
            k: (float(v[0]), float(v[1]), float(v[2])) for k, v in entitlements},
        quota_rows=tuple(QuotaRow(*row) for row in doc["quotaRows"]),
        cohorts=dict(doc["cohorts"]),
        quota_cohorts=tuple(CohortRow(*row) for row in doc.get("quotaCohorts", ())),
        tenant_weights=dict(doc.get("tenantWeights", ())),
        fair_usage=None if fair_usage is None else {
            (k[0], k[1]): (float(v[0]), float(v[1]), float(v[2])) for k, v in fair_usage},
        holds={uuid.UUID(t): {p: _vec(v) for p, v in pools} for t, pools in doc["holds"]},
        waiting={uuid.UUID(t): (n, _at(by) or datetime.min) for t, n, by in doc["waiting"]},
        victims=tuple(_victim_decode(v) for v in doc["victims"]),
        reclaim=_reclaim_decode(doc["reclaim"]),
        nomination=_nomination_decode(doc["nomination"]),
    )
    return Recorded(inputs, doc["profile"])


# --- decisions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """What a plan decided for one task: its placement (pool, score, score components and
    members) or the code it was handed back with."""

    task_id: str
    pool_id: str | None
    score: float | None
    #: (plugin, weighted value) per score component of the placement.
    components: tuple[tuple[str, float], ...] = ()
    members: tuple[tuple[str, int], ...] = ()
    #: The hand-back's code (None: placed).
    code: str | None = None


#: A decision as stored: task id, pool id, score, components, members, code.
DecisionRow = Sequence[Any]


def decision_rows(plan: PassPlan) -> list[DecisionRow]:
    """Return each task's decision in ``plan`` as stored (see :class:`Decision`):
    placements first, then hand-backs, each in the plan's order.

    A task id is kept as a :class:`uuid.UUID`, which orjson writes as ``str()`` does (and
    faster), or else as its text (asyncpg's UUID type, which orjson does not write); the
    rows are tuples. Their JSON is what every record format wrote, so that a plan digest
    (:func:`plan_digest`) compares with the digests of older records.
    """
    out: list[DecisionRow] = []
    add = out.append
    for task, _, result, members in plan.placed:
        tid: uuid.UUID | str = task.id
        if tid.__class__ is not _UUID:
            tid = str(tid)
        if result.__class__ is Ranked:
            add((tid, result.pool_ids[0], float(result.scores[0]),  # type: ignore[union-attr]
                 [(n, float(v)) for n, v, _ in result.components],  # type: ignore[union-attr]
                 members, None))
            continue
        placement = result.placement
        assert placement is not None
        add((tid, placement.pool_id, float(placement.score),
             [(c.name, float(c.value)) for c in placement.components], members, None))
    out.extend((u.task_id if u.task_id.__class__ is _UUID else str(u.task_id), None, None,
                (), (), u.reason) for u in plan.unclaims)
    return out


def decision_from_row(row: DecisionRow) -> Decision:
    tid, pool, score, comps, members, code = row
    return Decision(str(tid), pool, score, tuple((n, v) for n, v in comps),
                    tuple((p, c) for p, c in members), code)


def decisions_of(plan: PassPlan) -> list[Decision]:
    """Return each task's decision in ``plan`` (the order of :func:`decision_rows`)."""
    return [decision_from_row(row) for row in decision_rows(plan)]


def plan_digest(
    plan: PassPlan, rows: list[DecisionRow] | orjson.Fragment | None = None
) -> str:
    """Return a digest of ``plan``: its decisions (``rows``, when already built, as a list
    or as its JSON), displacements and nominations."""
    doc = [
        rows if rows is not None else decision_rows(plan),
        [[str(g.task_id), [str(v) for v in g.victims], g.holds, _t(g.revoke_by), str(g.kind)]
         for g in plan.displaced],
        sorted((str(t), o) for t, o in plan.nominations_ended.items()),
        [[str(n.task_id), n.runtime_class] for n in plan.nominations_created],
        sorted(str(t) for t in plan.nominees_passed),
    ]
    return hashlib.sha256(orjson.dumps(doc)).hexdigest()[:32]


def decisions_encode(rows: list[DecisionRow]) -> bytes:
    """Return the bytes of a plan's decisions (:func:`decision_rows`)."""
    return _pack({"decisions": rows})


def decisions_packed(plan: PassPlan) -> tuple[str, bytes]:
    """Return the digest of ``plan`` (:func:`plan_digest`) and the bytes of its decisions
    (:func:`decisions_encode`), their JSON written once for both."""
    rows = orjson.Fragment(orjson.dumps(decision_rows(plan)))
    return plan_digest(plan, rows), _pack({"decisions": rows})


def decisions_decode(blob: bytes) -> list[Decision]:
    """Return the decisions of :func:`decisions_encode`'s bytes."""
    return [decision_from_row(row) for row in _unpack(blob)["decisions"]]


def inputs_differ(blob: bytes, inputs: PassInputs) -> list[str]:
    """Return the parts of the recorded ``blob`` that ``inputs`` (decoded from it) encode
    differently: empty when the record's inputs survive decoding whole."""
    snap = inputs.snapshot
    before = _comparable(_unpack(blob), snap)
    after = _comparable(_unpack(inputs_encode(inputs)), snap)
    return [k for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]


def _comparable(doc: dict[str, Any], built: Snapshot) -> dict[str, Any]:
    """Return a record's inputs as parts comparable across formats: the claimed tasks
    decoded (formats 1 and 2 write them differently), every pool's arrays (over the static
    pools of ``built``, as format 3 writes only the changed ones), the version left out."""
    tasks, invalid = _tasks_decode(doc)
    parts = {k: v for k, v in doc.items()
             if k not in ("format", "texts", "tasks", "invalid", "invalidWhy", "arrays",
                          "reserved", "poolsChanged")}
    arrays = [a.tolist() for a in _arrays_decode(doc, built)]
    return {**parts, "arrays": arrays, "tasks": tasks, "invalid": invalid}
