"""The core's data: pool state, placed tasks, the immutable snapshot, the per-pass overlay, and
the result types.

A :class:`Snapshot` is built once per pass and never changes afterwards: pools are sorted by id
(so array index order *is* the tie-break order) and turned into numpy arrays plus indexes by
tenant, runtime class, label and placed task. It keeps private memo tables for derived arrays,
which are pure functions of the snapshot. :class:`Assumed` is the mutable overlay of one pass:
usage and placements decided in this pass but not yet committed.
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
        placed_by_tenant: dict[str, list[tuple[Items, np.ndarray]]] = {}
        for t in placed:
            idx = [self.pos[p] for p in t.pool_ids if p in self.pos]
            if idx:
                entry = (frozenset(t.labels.items()), np.array(idx, dtype=np.intp))
                placed_by_tenant.setdefault(t.tenant_id, []).append(entry)
        self._placed = placed_by_tenant
        self._memo: dict[Any, Any] = {}
        return self

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

    __slots__ = ("snapshot", "usage", "version", "_entries", "_by_tenant")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.usage = np.zeros((snapshot.n, 3), dtype=np.int64)
        self.version = 0
        self._entries: dict[str, _AssumedEntry] = {}
        self._by_tenant: dict[str, dict[str, _AssumedEntry]] = {}

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
        np.add.at(self.usage, idx, counts[:, None] * req)
        entry = _AssumedEntry(spec.tenant_id, spec.labels, idx, counts, req)
        self._entries[task_id] = entry
        self._by_tenant.setdefault(spec.tenant_id, {})[task_id] = entry
        self.version += 1

    def remove(self, task_id: str) -> None:
        """Undo an assumed placement (its reservation lost a race or was not applied)."""
        entry = self._entries.pop(task_id, None)
        if entry is None:
            return
        np.subtract.at(self.usage, entry.idx, entry.counts[:, None] * entry.requests)
        del self._by_tenant[entry.tenant_id][task_id]
        self.version += 1

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
        return {
            "poolId": self.pool_id,
            "score": round(self.score, 4),
            "components": [c.to_json() for c in self.components],
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
