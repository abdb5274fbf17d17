"""Replay: plan a recorded pass again with this build's planner, and compare.

:func:`pass_replay` takes a recorded pass's inputs and the decisions it committed, plans the
inputs again (under another profile when asked: a what-if) and returns every decision that
differs, with the components that differ (``why``). Each pass replays from its own recorded
inputs: a changed decision does not carry into the next pass's inputs (no cascade).

:class:`Effects` adds up what a what-if changes over the replayed passes, committed against
replayed: placements per tenant, the spread of pool utilisation after each pass, the
cost-weighted load placed, the failure domains each tenant's placements land on, waits that
would have ended (pending then, placed now) or begun, and placements that borrow quota.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.scheduling.inputs import PassInputs, PassSettings
from app.scheduling.planner import plan_pass
from app.scheduling.profiles import Decides
from app.scheduling.recording import (
    Decision,
    RecordFormatError,
    decision_from_row,
    decision_rows,
    decisions_decode,
    inputs_decode,
    inputs_differ,
    plan_digest,
    pools_decode,
)
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import StoredSpecs

__all__ = ["Change", "Effects", "PassReplay", "Record", "Replaying", "decisions_compare",
           "pass_replay", "what_if"]

#: Scores closer than this are equal (a score is a weighted sum of floats).
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Change:
    """A decision that differs on replay: what was committed, what is decided now, why."""

    pass_id: str
    committed: Decision
    replayed: Decision
    #: What differs: ``outcome`` (placed against handed back), ``pool``, ``members``,
    #: ``code``, ``score``, and the name of each score component whose value differs.
    why: tuple[str, ...]

    def document(self) -> dict[str, Any]:
        """Return the change as the API shows it."""
        return {"passId": self.pass_id, "taskId": self.committed.task_id,
                "committed": _side(self.committed), "replayed": _side(self.replayed),
                "why": list(self.why)}


def _side(d: Decision) -> dict[str, Any]:
    out: dict[str, Any] = {"poolId": d.pool_id, "score": d.score}
    if d.code is not None:
        out["pendingCode"] = d.code
    return out


def _why(a: Decision, b: Decision) -> tuple[str, ...]:
    if (a.pool_id is None) != (b.pool_id is None):
        return ("outcome",)
    why: list[str] = []
    if a.pool_id != b.pool_id:
        why.append("pool")
    elif a.members != b.members:
        why.append("members")
    if a.code != b.code:
        why.append("code")
    if a.score is not None and b.score is not None and abs(a.score - b.score) > _EPSILON:
        why.append("score")
    ca, cb = dict(a.components), dict(b.components)
    why.extend(name for name in dict.fromkeys([*ca, *cb])
               if abs(ca.get(name, 0.0) - cb.get(name, 0.0)) > _EPSILON
               or (name in ca) != (name in cb))
    return tuple(why)


#: What makes a different decision under another profile (scores differ by design).
_DECISIVE = frozenset({"outcome", "pool", "members", "code"})


def decisions_compare(
    pass_id: str, committed: Iterable[Decision], replayed: Iterable[Decision], *,
    scores: bool = True,
) -> list[Change]:
    """Return the decisions of ``replayed`` that differ from ``committed`` (by task); with
    ``scores`` False, only those placed elsewhere or handed back otherwise."""
    now = {d.task_id: d for d in replayed}
    out = []
    for d in committed:
        r = now.get(d.task_id) or Decision(d.task_id, None, None, code="missing")
        why = _why(d, r)
        if why and (scores or _DECISIVE.intersection(why)):
            out.append(Change(pass_id, d, r, why))
    return out


@dataclass(frozen=True, slots=True)
class PassReplay:
    """One pass replayed: its decisions then and now, and whether the plans are equal."""

    pass_id: str
    committed: list[Decision]
    replayed: list[Decision]
    changes: list[Change]
    plan_identical: bool


def what_if(inputs: PassInputs, decides: Decides) -> PassInputs:
    """Return ``inputs`` under another profile's plugins and settings (its strategy must be
    the snapshot's: decode the record with it, see
    :func:`~app.scheduling.recording.inputs_decode`)."""
    if decides.strategy != inputs.snapshot.strategy:
        raise ValueError("the snapshot was built for another strategy")
    return dataclasses.replace(inputs, profile=decides.profile, settings=decides.settings)


def pass_replay(
    pass_id: str, inputs: PassInputs, committed: list[Decision], committed_digest: str,
    decides: Decides | None = None,
) -> PassReplay:
    """Plan the recorded ``inputs`` again (under ``decides`` when given) and compare with
    the ``committed`` decisions and plan digest: every difference counts under the recorded
    profile, and only other placements and hand-backs under another one (its scores differ
    by design)."""
    plan = plan_pass(what_if(inputs, decides) if decides is not None else inputs)
    rows = decision_rows(plan)
    replayed = [decision_from_row(row) for row in rows]
    return PassReplay(pass_id, committed, replayed,
                      decisions_compare(pass_id, committed, replayed,
                                        scores=decides is None),
                      plan_digest(plan, rows) == committed_digest)


@dataclass(slots=True)
class _Side:
    """One side's effects (committed or replayed), added up over passes."""

    placed: Counter[str] = field(default_factory=Counter)
    spread: list[float] = field(default_factory=list)
    cost: float = 0.0
    load: float = 0.0
    domains: dict[str, set[str]] = field(default_factory=dict)
    borrowing: Counter[str] = field(default_factory=Counter)

    def document(self) -> dict[str, Any]:
        return {
            "placedByTenant": dict(sorted(self.placed.items())),
            "utilisationSpread": round(float(np.mean(self.spread)), 6) if self.spread else None,
            "costWeightedLoad": round(self.cost / self.load, 6) if self.load else None,
            "failureDomainsByTenant": {t: len(d) for t, d in sorted(self.domains.items())},
            "borrowingPlacementsByTenant": dict(sorted(self.borrowing.items())),
        }


class Effects:
    """What a replay changes, added up pass by pass (see the module doc)."""

    def __init__(self) -> None:
        self.sides = {"committed": _Side(), "replayed": _Side()}
        self.waits_ended = 0
        self.waits_begun = 0
        self.changed = 0

    def add(self, inputs: PassInputs, replay: PassReplay) -> None:
        """Add one replayed pass planned from ``inputs``."""
        self.changed += len(replay.changes)
        for change in replay.changes:
            before, after = change.committed.pool_id, change.replayed.pool_id
            if before is None and after is not None:
                self.waits_ended += 1
            elif before is not None and after is None:
                self.waits_begun += 1
        tasks = {str(t.id): (t.tenant_id, spec) for t, spec in inputs.tasks}
        for name, decisions in (("committed", replay.committed), ("replayed", replay.replayed)):
            self._side(self.sides[name], inputs, tasks, decisions)

    @staticmethod
    def _side(side: _Side, inputs: PassInputs, tasks: Mapping[str, Any],
              decisions: list[Decision]) -> None:
        snap = inputs.snapshot
        reserved = snap.reserved.copy()
        used = {(r.tenant_id, r.runtime_class, r.resource): r.used for r in inputs.quota_rows}
        nominal = {k: r.nominal for r in inputs.quota_rows
                   for k in [(r.tenant_id, r.runtime_class, r.resource)]}
        fd_name = {code: name for name, code in snap.fd_table.items()}
        for d in decisions:
            if d.pool_id is None or d.task_id not in tasks:
                continue
            tenant, spec = tasks[d.task_id]
            side.placed[tenant] += 1
            req = np.array(spec.requests, dtype=np.int64)
            borrows = False
            for pool_id, count in d.members:
                i = snap.pos[pool_id]
                reserved[i] += req * count
                side.cost += float(snap.cost[i]) * int(req[0]) * count
                side.load += int(req[0]) * count
                side.domains.setdefault(tenant, set()).add(fd_name.get(int(snap.fd[i]), ""))
            for k, resource in enumerate(("cpuMillis", "memoryMiB", "llmSlots")):
                key = (tenant, spec.runtime_class, resource)
                if key in used:
                    used[key] += int(spec.total_requests[k])
                    borrows = borrows or used[key] > nominal[key]
            if borrows:
                side.borrowing[tenant] += 1
        # A pool's utilisation: its fullest resource (of those it has any of).
        cap = snap.cap[snap.has_ledger]
        if len(cap):
            share = np.divide(reserved[snap.has_ledger], cap, out=np.zeros(cap.shape),
                              where=cap > 0)
            side.spread.append(float(share.max(axis=1).std()))

    def document(self) -> dict[str, Any]:
        """Return the summary of the effects."""
        return {
            "decisionsChanged": self.changed,
            "waitsEnded": self.waits_ended,
            "waitsBegun": self.waits_begun,
            **{name: side.document() for name, side in self.sides.items()},
        }


@dataclass(frozen=True, slots=True)
class Record:
    """A stored pass record, as a replay reads it."""

    pass_id: str
    pools_digest: str
    plan_digest: str
    inputs: bytes
    decisions: bytes


class Replaying:
    """A replay under way: records go in (:meth:`add`), the answer comes out
    (:meth:`document`). ``decides`` None replays under each pass's recorded profile."""

    def __init__(self, decides: Callable[[PassSettings], Decides] | None = None, *,
                 changes_kept: int = 1000) -> None:
        self.decides = decides
        self.changes_kept = changes_kept
        self.specs = StoredSpecs(4096)
        self.passes = 0
        self.pass_ids: list[str] = []
        self.decisions = 0
        self.plans_identical = 0
        self.changes: list[Change] = []
        self.changed = 0
        self.effects = Effects()
        self.skipped: list[dict[str, str]] = []
        #: For a difference under the recorded profile: the inputs the record's decoding
        #: changed (a serialisation defect), else the planner of this build decides
        #: otherwise.
        self.defects: list[dict[str, Any]] = []
        self._bases: dict[tuple[str, str], Snapshot] = {}

    def add(self, records: Iterable[Record], pools: Mapping[str, bytes]) -> None:
        """Replay ``records``, whose static pools are in ``pools`` by digest."""
        for r in records:
            blob = pools.get(r.pools_digest)
            if blob is None:
                self.skipped.append({"passId": r.pass_id, "reason": "its pools were pruned"})
                continue
            try:
                self._add(r, blob)
            except RecordFormatError as exc:
                self.skipped.append({"passId": r.pass_id, "reason": str(exc)})

    def _base(self, digest: str, blob: bytes, strategy: str) -> Snapshot:
        key = (digest, strategy)
        hit = self._bases.get(key)
        if hit is None:
            if len(self._bases) > 8:
                self._bases.clear()
            hit = self._bases[key] = Snapshot.build(pools_decode(blob), strategy=strategy)
        return hit

    def _add(self, r: Record, pools_blob: bytes) -> None:
        recorded = inputs_decode(r.inputs, (), specs=self.specs,
                                 base=lambda s: self._base(r.pools_digest, pools_blob, s))
        inputs, decides = recorded.inputs, None
        if self.decides is not None:
            decides = self.decides(inputs.settings)
            if decides.strategy != inputs.snapshot.strategy:
                inputs = inputs_decode(
                    r.inputs, (), specs=self.specs, strategy=decides.strategy,
                    base=lambda s: self._base(r.pools_digest, pools_blob, s)).inputs
        replay = pass_replay(r.pass_id, inputs, decisions_decode(r.decisions), r.plan_digest,
                             decides)
        self.passes += 1
        if len(self.pass_ids) < self.changes_kept:
            self.pass_ids.append(r.pass_id)
        self.decisions += len(replay.committed)
        self.plans_identical += replay.plan_identical
        self.changed += len(replay.changes)
        self.changes.extend(replay.changes[:max(0, self.changes_kept - len(self.changes))])
        self.effects.add(inputs, replay)
        if decides is None and (replay.changes or not replay.plan_identical):
            differ = inputs_differ(r.inputs, inputs)
            self.defects.append({"passId": r.pass_id, "inputs": differ,
                                 "planner": not differ})

    def document(self) -> dict[str, Any]:
        """Return the replay's answer."""
        return {
            "passes": self.passes,
            "decisions": self.decisions,
            "identical": self.decisions - self.changed,
            "changed": [c.document() for c in self.changes],
            "summary": {
                "profile": "given" if self.decides is not None else "recorded",
                "cascade": False,
                "note": "each pass is replayed from its own recorded inputs: a changed "
                        "decision does not change the inputs of later passes",
                "passIds": self.pass_ids,
                "changedTotal": self.changed,
                "plansIdentical": self.plans_identical,
                "skipped": self.skipped,
                "defects": self.defects,
                **self.effects.document(),
            },
        }
