"""The core's data: pool state, placed tasks, the immutable snapshot, the per-pass overlay, and
the result types.

A :class:`Snapshot` is built once per pass (or derived from the previous pass's with
:meth:`Snapshot.with_usage`, sharing its static part) and never changes afterwards: pools are
sorted by id (so array index order *is* the tie-break order) and turned into numpy arrays plus
indexes by tenant, runtime class, label and placed task. It keeps private memo tables for
derived arrays, which are pure functions of the snapshot. :class:`Assumed` is the mutable
overlay of one pass: usage and placements decided in this pass but not yet committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from app.scheduling.reasons import Reason

if TYPE_CHECKING:
    from app.scheduling.spec import CompiledSpec

__all__ = [
    "Assumed",
    "Candidate",
    "NoPlacement",
    "PlacedTask",
    "Placement",
    "PoolState",
    "Rejection",
    "Result",
    "ScoreComponent",
    "Snapshot",
]

STATUSES = ("ACTIVE", "CORDONED", "DRAINING")
TOPOLOGIES = ("pool", "failureDomain", "region")
Items = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class PoolState:
    """One pool as the core sees it: identity, placement keys, health and ledger totals."""

    id: str
    tenant_ids: frozenset[str]
    runtime_class: str
    runtime_instance_id: str = ""
    region: str = ""
    data_residency: str | None = None
    failure_domain: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    artifact_regions: frozenset[str] = frozenset()
    cost_weight: float = 1.0
    status: str = "ACTIVE"
    ready: bool = True
    heartbeat_fresh: bool = True
    capacity: tuple[int, int, int] | None = None
    reserved: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class PlacedTask:
    """A leased placement that affinity terms of the same tenant can match."""

    task_id: str
    tenant_id: str
    labels: Mapping[str, str]
    pool_ids: tuple[str, ...]


def _codes(values: Sequence[Any]) -> tuple[np.ndarray, dict[Any, int]]:
    """Return an int32 code per value and the value -> code table (None gets -1)."""
    table: dict[Any, int] = {}
    out = np.empty(len(values), dtype=np.int32)
    for i, v in enumerate(values):
        if v is None:
            out[i] = -1
            continue
        code = table.get(v)
        if code is None:
            code = table[v] = len(table)
        out[i] = code
    return out, table


class Snapshot:
    """Immutable pools, ledger usage, health and placed tasks, as arrays and indexes."""

    __slots__ = (
        "pools",
        "ids",
        "pos",
        "n",
        "strategy",
        "cap",
        "has_ledger",
        "reserved",
        "status",
        "ready",
        "fresh",
        "rc",
        "rc_table",
        "region",
        "region_table",
        "residency",
        "residency_table",
        "fd",
        "fd_table",
        "cost",
        "by_tenant",
        "_label_idx",
        "_artifact_idx",
        "_placed",
        "_memo",
    )

    @classmethod
    def build(
        cls,
        pools: Iterable[PoolState],
        placed: Iterable[PlacedTask] = (),
        *,
        strategy: str = "spread",
    ) -> Snapshot:
        """Build a snapshot from pool states and actual placements, indexing everything once."""
        if strategy not in ("spread", "binpack"):
            raise ValueError(f"unknown strategy {strategy!r} (spread or binpack)")
        self = cls.__new__(cls)
        ps = tuple(sorted(pools, key=lambda p: p.id))
        self.pools = ps
        self.ids = tuple(p.id for p in ps)
        self.pos = {pid: i for i, pid in enumerate(self.ids)}
        if len(self.pos) != len(ps):
            raise ValueError("duplicate pool id in snapshot")
        n = self.n = len(ps)
        self.strategy = strategy
        self.cap = np.array([p.capacity or (0, 0, 0) for p in ps], dtype=np.int64).reshape(n, 3)
        self.has_ledger = np.array([p.capacity is not None for p in ps], dtype=bool)
        self.reserved = np.array([p.reserved for p in ps], dtype=np.int64).reshape(n, 3)
        self.status = np.array([STATUSES.index(p.status) for p in ps], dtype=np.int8)
        self.ready = np.array([p.ready for p in ps], dtype=bool)
        self.fresh = np.array([p.heartbeat_fresh for p in ps], dtype=bool)
        self.rc, self.rc_table = _codes([p.runtime_class for p in ps])
        self.region, self.region_table = _codes([p.region for p in ps])
        self.residency, self.residency_table = _codes([p.data_residency or None for p in ps])
        self.fd, self.fd_table = _codes([p.failure_domain for p in ps])
        self.cost = np.array([float(p.cost_weight) for p in ps], dtype=np.float64)
        by_tenant: dict[str, list[int]] = {}
        label_idx: dict[tuple[str, str], list[int]] = {}
        artifact_idx: dict[str, list[int]] = {}
        for i, p in enumerate(ps):
            for t in p.tenant_ids:
                by_tenant.setdefault(t, []).append(i)
            for kv in p.labels.items():
                label_idx.setdefault(kv, []).append(i)
            for r in p.artifact_regions:
                artifact_idx.setdefault(r, []).append(i)
        self.by_tenant = {t: np.array(v, dtype=np.intp) for t, v in by_tenant.items()}
        self._label_idx = {k: np.array(v, dtype=np.intp) for k, v in label_idx.items()}
        self._artifact_idx = {k: np.array(v, dtype=np.intp) for k, v in artifact_idx.items()}
        self._placed = self._placed_index(placed)
        self._memo: dict[Any, Any] = {}
        return self

    def with_usage(
        self,
        *,
        capacity: Sequence[tuple[int, int, int] | None],
        reserved: Sequence[tuple[int, int, int]],
        fresh: Sequence[bool],
        placed: Iterable[PlacedTask] = (),
    ) -> Snapshot:
        """Return a snapshot of the same pools with new ledger totals, reservations, heartbeat
        freshness and placements, sharing this one's static arrays, indexes and memo tables.

        The sequences are aligned with ``ids``. This snapshot stays valid and unchanged; pool
        states whose values did not change are reused as they are.
        """
        n = self.n
        if not (len(capacity) == len(reserved) == len(fresh) == n):
            raise ValueError(f"usage for {n} pools expected")
        new = Snapshot.__new__(Snapshot)
        for name in _STATIC_SLOTS:
            object.__setattr__(new, name, getattr(self, name))
        new.cap = np.array(
            [c or (0, 0, 0) for c in capacity], dtype=np.int64
        ).reshape(n, 3)
        new.has_ledger = np.array([c is not None for c in capacity], dtype=bool)
        new.reserved = np.array(reserved, dtype=np.int64).reshape(n, 3)
        new.fresh = np.array(fresh, dtype=bool).reshape(n)
        # Only pools whose values changed get a new state (found by array compares).
        changed = np.flatnonzero(
            (new.cap != self.cap).any(axis=1)
            | (new.reserved != self.reserved).any(axis=1)
            | (new.has_ledger != self.has_ledger)
            | (new.fresh != self.fresh)
        )
        pools = list(self.pools)
        for i in changed.tolist():
            p = pools[i]
            c = capacity[i]
            pools[i] = PoolState(
                p.id, p.tenant_ids, p.runtime_class, p.runtime_instance_id, p.region,
                p.data_residency, p.failure_domain, p.labels, p.artifact_regions, p.cost_weight,
                p.status, p.ready, bool(fresh[i]), None if c is None else tuple(c),
                tuple(reserved[i]),
            )
        new.pools = tuple(pools)
        new._placed = new._placed_index(placed)
        # Memo entries over static columns carry over; the static filters' verdicts also read
        # heartbeat freshness and ledger presence, so they carry over only when those held.
        keep = _MEMO_STATIC
        if np.array_equal(new.fresh, self.fresh) and np.array_equal(
            new.has_ledger, self.has_ledger
        ):
            keep = keep | {"static"}
        carried = {k: v for k, v in self._memo.items() if k[0] in keep}
        # Selector masks are keyed by what specs ask for: start over rather than grow forever.
        new._memo = carried if len(carried) <= MEMO_CARRIED else {}
        return new

    def _placed_index(
        self, placed: Iterable[PlacedTask]
    ) -> dict[str, list[tuple[Items, np.ndarray]]]:
        """Return the placed tasks by tenant as (labels, pool indexes), skipping unknown pools."""
        pos = self.pos
        out: dict[str, list[tuple[Items, np.ndarray]]] = {}
        for t in placed:
            idx = [pos[p] for p in t.pool_ids if p in pos]
            if idx:
                entry = (frozenset(t.labels.items()), np.array(idx, dtype=np.intp))
                out.setdefault(t.tenant_id, []).append(entry)
        return out

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_memo" and hasattr(self, "_memo"):
            raise AttributeError("Snapshot is immutable")
        object.__setattr__(self, name, value)

    # --- derived arrays (memoized; pure functions of the snapshot) ---------------------------

    def visible(self, tenant_id: str) -> np.ndarray:
        """Return the indexes of the pools that list ``tenant_id`` (sorted by pool id)."""
        return self.by_tenant.get(tenant_id, _EMPTY)

    def selector_mask(self, selector: Items) -> np.ndarray:
        """Return a bool mask of the pools whose labels contain every selector item."""
        key = ("sel", selector)
        mask = self._memo.get(key)
        if mask is None:
            mask = np.ones(self.n, dtype=bool)
            for kv in selector:
                m = np.zeros(self.n, dtype=bool)
                m[self._label_idx.get(kv, _EMPTY)] = True
                mask &= m
            self._memo[key] = mask
        return mask

    def artifact_mask(self, region: str) -> np.ndarray:
        """Return a bool mask of pools in ``region`` or holding its artifacts."""
        key = ("art", region)
        mask = self._memo.get(key)
        if mask is None:
            mask = np.zeros(self.n, dtype=bool)
            code = self.region_table.get(region)
            if code is not None:
                mask |= self.region == code
            mask[self._artifact_idx.get(region, _EMPTY)] = True
            self._memo[key] = mask
        return mask

    def domains(self, topology: str) -> tuple[np.ndarray, int]:
        """Return the domain code of every pool for ``topology`` and the number of domains."""
        if topology == "pool":
            return _arange(self.n), self.n
        if topology == "failureDomain":
            return self.fd, len(self.fd_table)
        if topology == "region":
            return self.region, len(self.region_table)
        raise ValueError(f"unknown topology {topology!r}")

    def placed_counts(self, tenant_id: str, selector: Items | None) -> np.ndarray:
        """Return, per pool, how many actual member placements of the tenant match ``selector``.

        ``selector=None`` counts every placement of the tenant.
        """
        key = ("placed", tenant_id, selector)
        counts = self._memo.get(key)
        if counts is None:
            counts = np.zeros(self.n, dtype=np.int64)
            for labels, idx in self._placed.get(tenant_id, ()):
                if selector is None or selector <= labels:
                    np.add.at(counts, idx, 1)
            self._memo[key] = counts
        return counts


#: Attributes that depend only on the pools' static columns (shared by ``with_usage``).
_STATIC_SLOTS = (
    "ids", "pos", "n", "strategy", "status", "ready", "rc", "rc_table", "region",
    "region_table", "residency", "residency_table", "fd", "fd_table", "cost", "by_tenant",
    "_label_idx", "_artifact_idx",
)
#: Memo kinds computed from static columns only (selector, artifact and tenant masks).
_MEMO_STATIC = frozenset({"sel", "art", "tenant_mask"})
#: At most this many memo entries carry over to a snapshot built by ``with_usage``.
MEMO_CARRIED = 4096

_EMPTY = np.zeros(0, dtype=np.intp)
_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    a = _ARANGE.get(n)
    if a is None:
        a = _ARANGE[n] = np.arange(n, dtype=np.intp)
    return a


@dataclass(slots=True)
class _AssumedEntry:
    tenant_id: str
    labels: Items
    idx: np.ndarray
    counts: np.ndarray
    requests: np.ndarray


class Assumed:
    """The mutable overlay of one pass: usage and placements decided but not yet committed."""

    __slots__ = ("snapshot", "usage", "used", "version", "_entries", "_by_tenant", "_domains")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.usage = np.zeros((snapshot.n, 3), dtype=np.int64)
        #: Reserved plus assumed usage per pool (``snapshot.reserved + usage``), kept in step.
        self.used = snapshot.reserved.copy()
        self.version = 0
        self._entries: dict[str, _AssumedEntry] = {}
        self._by_tenant: dict[str, dict[str, _AssumedEntry]] = {}
        # Per tenant and topology, the members of all its assumed placements per domain, kept
        # up to date by add/remove once asked for (spreading reads them for every task).
        self._domains: dict[str, dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._entries

    def add(self, spec: CompiledSpec, members: Sequence[tuple[str, int]]) -> None:
        """Record a decided placement: its usage and its labels for later affinity checks."""
        task_id = spec.task_id
        if task_id is None:
            raise ValueError("an assumed placement needs a task id")
        if task_id in self._entries:
            self.remove(task_id)
        pos = self.snapshot.pos
        idx = np.array([pos[p] for p, _ in members], dtype=np.intp)
        counts = np.array([c for _, c in members], dtype=np.int64)
        req = np.array(spec.requests, dtype=np.int64)
        amounts = counts[:, None] * req
        if len(idx) == 1:
            self.usage[idx[0]] += amounts[0]
            self.used[idx[0]] += amounts[0]
        else:
            np.add.at(self.usage, idx, amounts)
            np.add.at(self.used, idx, amounts)
        entry = _AssumedEntry(spec.tenant_id, spec.labels, idx, counts, req)
        self._entries[task_id] = entry
        self._by_tenant.setdefault(spec.tenant_id, {})[task_id] = entry
        self._domains_update(entry, 1)
        self.version += 1

    def remove(self, task_id: str) -> None:
        """Undo an assumed placement (its reservation lost a race or was not applied)."""
        entry = self._entries.pop(task_id, None)
        if entry is None:
            return
        amounts = entry.counts[:, None] * entry.requests
        np.subtract.at(self.usage, entry.idx, amounts)
        np.subtract.at(self.used, entry.idx, amounts)
        del self._by_tenant[entry.tenant_id][task_id]
        self._domains_update(entry, -1)
        self.version += 1

    def _domains_update(self, entry: _AssumedEntry, sign: int) -> None:
        tracked = self._domains.get(entry.tenant_id)
        if tracked:
            for topology, per_domain in tracked.items():
                dom, _ = self.snapshot.domains(topology)
                np.add.at(per_domain, dom[entry.idx], sign * entry.counts)

    def domain_counts(self, tenant_id: str, topology: str) -> np.ndarray | None:
        """Return per ``topology`` domain the members of all the tenant's assumed placements
        (indexed by ``Snapshot.domains`` codes), or None when there are none; read-only."""
        if not self._by_tenant.get(tenant_id):
            return None
        tracked = self._domains.setdefault(tenant_id, {})
        per_domain = tracked.get(topology)
        if per_domain is None:
            dom, nd = self.snapshot.domains(topology)
            per_domain = np.zeros(nd, dtype=np.int64)
            for e in self._by_tenant[tenant_id].values():
                np.add.at(per_domain, dom[e.idx], e.counts)
            tracked[topology] = per_domain
        return per_domain

    def placed_counts(self, tenant_id: str, selector: Items | None) -> np.ndarray | None:
        """Return per-pool member counts of the tenant's assumed placements matching
        ``selector`` (None: all), or None when there are none."""
        entries = self._by_tenant.get(tenant_id)
        if not entries:
            return None
        counts = None
        for e in entries.values():
            if selector is None or selector <= e.labels:
                if counts is None:
                    counts = np.zeros(self.snapshot.n, dtype=np.int64)
                np.add.at(counts, e.idx, e.counts)
        return counts


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScoreComponent:
    """One score plugin's weighted contribution to a pool's total, with a human reason."""

    name: str
    value: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        """Return the API shape ``{"name", "value", "reason"}``."""
        return {"name": self.name, "value": round(self.value, 4), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Candidate:
    """A feasible pool with its total score and components."""

    pool_id: str
    score: float
    components: tuple[ScoreComponent, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return the preview shape ``{"poolId", "score", "components"}``."""
        return {
            "poolId": self.pool_id,
            "score": round(self.score, 4),
            "components": [c.to_json() for c in self.components],
        }


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision: the first member's pool, its score, every member's pool, alternatives."""

    pool_id: str
    score: float
    components: tuple[ScoreComponent, ...]
    members: tuple[tuple[str, int], ...]
    alternatives: tuple[Candidate, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return the SPEC §6 placement shape."""
        # Built inline (no per-item method calls): the reconciler stores one per placement.
        return {
            "poolId": self.pool_id,
            "score": round(self.score, 4),
            "components": [
                {"name": c.name, "value": round(c.value, 4), "reason": c.reason}
                for c in self.components
            ],
            "members": [{"poolId": p, "count": c} for p, c in self.members],
            "alternatives": [
                {"poolId": a.pool_id, "score": round(a.score, 4)} for a in self.alternatives
            ],
        }


@dataclass(frozen=True, slots=True)
class Rejection:
    """A visible pool that failed a filter, with its reason codes."""

    pool_id: str
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Return the preview shape ``{"poolId", "reasons"}``."""
        return {"poolId": self.pool_id, "reasons": list(self.reasons)}


@dataclass(frozen=True, slots=True)
class NoPlacement:
    """Why a task fits nowhere: headline code, a sentence, and rejected pools by code."""

    code: Reason
    message: str
    rejections: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the SPEC §6 pending reason shape ``{"code", "message", "rejections"}``."""
        return {
            "code": str(self.code),
            "message": self.message,
            "rejections": {str(k): int(v) for k, v in self.rejections.items()},
        }


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of ``select``: placement or reason, ranked candidates, rejections."""

    placement: Placement | None
    candidates: tuple[Candidate, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    rejection_counts: Mapping[Reason, int] = field(default_factory=dict)
    reason: NoPlacement | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the preview shape ``{"placement", "candidates", "rejected", "reason"}``."""
        return {
            "placement": self.placement.to_json() if self.placement else None,
            "candidates": [c.to_json() for c in self.candidates],
            "rejected": [r.to_json() for r in self.rejected],
            "reason": self.reason.to_json() if self.reason else None,
        }
