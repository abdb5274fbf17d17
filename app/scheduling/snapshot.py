"""The immutable snapshot a pass decides on: pool states, placed tasks, and their arrays.

A :class:`Snapshot` is built once per pass (or derived from the previous pass's with
:meth:`Snapshot.with_usage`, sharing its static part) and never changes afterwards: pools are
sorted by id (so array index order *is* the tie-break order) and turned into numpy arrays plus
indexes by tenant, runtime class, label and placed task. Derived arrays are pure functions of
the snapshot, so they are memoized on it: the snapshot's own (selector, artifact and tenant
masks, placed counts) and, through :meth:`Snapshot.memoized`, the framework's and plugins'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    from app.scheduling.spec import Items

__all__ = ["MEMO_CARRIED", "PlacedTask", "PoolState", "Snapshot", "pool_states_made"]

T = TypeVar("T")
K = TypeVar("K")
C = TypeVar("C")

STATUSES = ("ACTIVE", "CORDONED", "DRAINING")


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


#: The setter of each field's slot of :class:`PoolState`, in field order.
_POOL_SETTERS = tuple(PoolState.__dict__[f.name].__set__ for f in fields(PoolState))


def pool_states_made(rows: Sequence[tuple[Any, ...]]) -> list[PoolState]:
    """Return the :class:`PoolState` of each of ``rows`` (every field, in order).

    A full read makes one per pool: the frozen dataclass's ``__init__`` sets each of its 15
    fields through ``object.__setattr__``; here each field's slot is set for every state at
    once (``map`` over the field's column), which makes the same frozen objects in a
    fraction of the time.
    """
    if not rows:
        return []
    states = [object.__new__(PoolState) for _ in rows]
    for set_slot, column in zip(_POOL_SETTERS, zip(*rows, strict=True), strict=True):
        deque(map(set_slot, states, column), maxlen=0)
    return states


@dataclass(frozen=True, slots=True)
class PlacedTask:
    """A leased placement that affinity terms of the same tenant can match.

    ``members[i]`` is how many members it holds on ``pool_ids[i]``; without ``members`` each
    entry of ``pool_ids`` is one member (a pool repeated once per member).
    """

    task_id: str
    tenant_id: str
    labels: Mapping[str, str]
    pool_ids: tuple[str, ...]
    members: tuple[int, ...] = ()


def _index(
    collections: Sequence[C], keys_of: Callable[[C], Iterable[K]]
) -> dict[K, np.ndarray]:
    """Return the ascending positions of the collections holding each key (``keys_of`` a
    collection), keys in order of first appearance (by position, then in the collection's
    order).

    Pools mostly share a few collection objects (tenant lists, label sets, as read): the
    positions are grouped by object with array operations, and each object's keys are
    listed once, at its first position."""
    n = len(collections)
    objects = np.fromiter(map(id, collections), dtype=np.uint64, count=n)
    _, first, group_of = np.unique(objects, return_index=True, return_inverse=True)
    by_group = np.argsort(group_of, kind="stable")  # ascending positions within a group
    counts = np.bincount(group_of, minlength=len(first))
    cumulative = np.cumsum(counts)
    ends = cumulative.tolist()
    starts = (cumulative - counts).tolist()
    firsts = first.tolist()
    parts: dict[K, list[np.ndarray]] = {}
    for g in np.argsort(first).tolist():  # groups in order of first appearance
        positions = by_group[starts[g]:ends[g]]
        for k in keys_of(collections[firsts[g]]):
            parts.setdefault(k, []).append(positions)
    return {k: v[0] if len(v) == 1 else np.sort(np.concatenate(v)) for k, v in parts.items()}


def _codes(values: Sequence[Any]) -> tuple[np.ndarray, dict[Any, int]]:
    """Return an int32 code per value and the value -> code table (None gets -1), codes in
    order of first appearance."""
    distinct = dict.fromkeys(values)
    distinct.pop(None, None)
    table = {v: code for code, v in enumerate(distinct)}
    lookup = {**table, None: -1}
    out = np.fromiter(map(lookup.__getitem__, values), dtype=np.int32, count=len(values))
    return out, table


class Snapshot:
    """Immutable pools, ledger usage, health and placed tasks, as arrays and indexes."""

    __slots__ = (
        "_pools",
        "_built",
        "instance_of",
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
        "audience",
        "_label_idx",
        "_artifact_idx",
        "_placed",
        "_memo",
    )

    #: The runtime instance of each pool (by id), what a lease names.
    instance_of: dict[str, str]
    #: Pool ids, sorted; a pool's row in every array is its index here.
    ids: tuple[str, ...]
    #: The row of each pool id.
    pos: dict[str, int]
    #: Number of pools.
    n: int
    #: ``spread`` or ``binpack``.
    strategy: str
    #: Capacity (cpu, memory, llm) per pool; zeros for a pool without a ledger.
    cap: np.ndarray
    #: Whether each pool has a ledger (a registered capacity).
    has_ledger: np.ndarray
    #: Reserved (cpu, memory, llm) per pool.
    reserved: np.ndarray
    #: Whether each pool's runtime heartbeat is fresh.
    fresh: np.ndarray
    #: Each pool's status, an index into ``STATUSES``.
    status: np.ndarray
    #: Whether each pool reports ready.
    ready: np.ndarray
    #: Code columns (int32, -1 for none) and their value -> code tables.
    rc: np.ndarray
    rc_table: dict[Any, int]
    region: np.ndarray
    region_table: dict[Any, int]
    residency: np.ndarray
    residency_table: dict[Any, int]
    fd: np.ndarray
    fd_table: dict[Any, int]
    #: Cost weight per pool.
    cost: np.ndarray
    #: The pools each tenant sees (sorted indexes); tenants that see the same pools share one.
    by_tenant: dict[str, np.ndarray]
    #: A number per distinct set of visible pools, by tenant.
    audience: dict[str, int]
    _pools: tuple[PoolState, ...] | None
    _built: tuple[tuple[PoolState, ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    _label_idx: dict[tuple[str, str], np.ndarray]
    _artifact_idx: dict[str, np.ndarray]
    _placed: dict[str, list[tuple[Items, np.ndarray, np.ndarray | int]]]
    _memo: dict[Any, Any]

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
        self._pools = ps
        self.ids = tuple(p.id for p in ps)
        self.instance_of = {p.id: p.runtime_instance_id for p in ps}
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
        # The states and the usage they hold: a derived snapshot's states start from them.
        self._built = (ps, self.cap, self.has_ledger, self.reserved, self.fresh)
        by_tenant = _index([p.tenant_ids for p in ps], iter)
        # Tenants that see the same pools share one index array and one audience number.
        shared: dict[bytes, tuple[int, np.ndarray]] = {}
        self.by_tenant = {}
        self.audience = {}
        for t, v in by_tenant.items():
            hit = shared.get(v.tobytes())
            if hit is None:
                hit = shared[v.tobytes()] = (len(shared), v)
            self.audience[t], self.by_tenant[t] = hit
        self._label_idx = _index([p.labels for p in ps], lambda labels: labels.items())
        self._artifact_idx = _index([p.artifact_regions for p in ps], iter)
        self._placed = self._placed_index(placed)
        self._memo = {}
        return self

    @property
    def static_pools(self) -> tuple[PoolState, ...]:
        """Return the pool states the static part was built from (shared by every snapshot
        derived from it; their ledger and health fields may be older than the arrays)."""
        return self._built[0]

    def built_usage(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return the ledger totals, ledger presence, reservations and heartbeat freshness of
        :attr:`static_pools` (the arrays the static part was built with)."""
        _, cap, has_ledger, reserved, fresh = self._built
        return cap, has_ledger, reserved, fresh

    def placed_entries(self) -> list[tuple[str, Items, np.ndarray, np.ndarray | int]]:
        """Return the indexed placements as (tenant, labels, pool indexes, members per
        index or 1 for each), in the order they were given."""
        return [(t, labels, idx, w) for t, entries in self._placed.items()
                for labels, idx, w in entries]

    @property
    def pools(self) -> tuple[PoolState, ...]:
        """Return the pool states in id order.

        A snapshot derived by :meth:`with_usage` builds them on first use (a pass never
        asks: it reads the arrays): a pool whose ledger and health equal those it was built
        with keeps its state object, the others get a new one.
        """
        pools = self._pools
        if pools is None:
            pools = self._pools_derive()
            object.__setattr__(self, "_pools", pools)
        return pools

    def _pools_derive(self) -> tuple[PoolState, ...]:
        built, cap, has_ledger, reserved, fresh = self._built
        changed = np.flatnonzero(
            (self.cap != cap).any(axis=1)
            | (self.reserved != reserved).any(axis=1)
            | (self.has_ledger != has_ledger)
            | (self.fresh != fresh)
        )
        pools = list(built)
        for i in changed.tolist():
            p = pools[i]
            pools[i] = PoolState(
                p.id, p.tenant_ids, p.runtime_class, p.runtime_instance_id, p.region,
                p.data_residency, p.failure_domain, p.labels, p.artifact_regions, p.cost_weight,
                p.status, p.ready, bool(self.fresh[i]),
                tuple(self.cap[i].tolist()) if self.has_ledger[i] else None,
                tuple(self.reserved[i].tolist()),
            )
        return tuple(pools)

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

        The sequences are aligned with ``ids`` (see :meth:`with_arrays`).
        """
        n = self.n
        if not (len(capacity) == len(reserved) == len(fresh) == n):
            raise ValueError(f"usage for {n} pools expected")
        return self.with_arrays(
            cap=np.array([c or (0, 0, 0) for c in capacity], dtype=np.int64).reshape(n, 3),
            has_ledger=np.array([c is not None for c in capacity], dtype=bool).reshape(n),
            reserved=np.array(reserved, dtype=np.int64).reshape(n, 3),
            fresh=np.array(fresh, dtype=bool).reshape(n),
            placed=placed,
        )

    def with_arrays(
        self,
        *,
        cap: np.ndarray,
        has_ledger: np.ndarray,
        reserved: np.ndarray,
        fresh: np.ndarray,
        placed: Iterable[PlacedTask] = (),
    ) -> Snapshot:
        """Return :meth:`with_usage`'s snapshot from arrays aligned with ``ids``: ledger totals
        and reservations (int64, ``(n, 3)``; a pool without a ledger has zero totals and
        ``has_ledger`` False) and heartbeat freshness (bool, ``(n,)``).

        The arrays become the new snapshot's own (the caller must not change them). This
        snapshot stays valid and unchanged.
        """
        n = self.n
        if not (cap.shape == reserved.shape == (n, 3) and has_ledger.shape == fresh.shape
                == (n,)):
            raise ValueError(f"usage for {n} pools expected")
        new = Snapshot.__new__(Snapshot)
        for name in _STATIC_SLOTS:
            object.__setattr__(new, name, getattr(self, name))
        new.cap = cap
        new.has_ledger = has_ledger
        new.reserved = reserved
        new.fresh = fresh
        new._pools = None
        new._placed = new._placed_index(placed)
        # Memo entries over static columns carry over; the static filters' verdicts also read
        # heartbeat freshness and ledger presence, so they carry over only when those held.
        keep = _MEMO_STATIC
        if np.array_equal(new.fresh, self.fresh) and np.array_equal(
            new.has_ledger, self.has_ledger
        ):
            keep = keep | _MEMO_HEALTH
        carried = {k: v for k, v in self._memo.items() if k[0] in keep}
        # Selector masks are keyed by what specs ask for: start over rather than grow forever.
        new._memo = carried if len(carried) <= MEMO_CARRIED else {}
        return new

    def with_reserved(self, reserved: np.ndarray) -> Snapshot:
        """Return this snapshot with other reservations (int64, ``(n, 3)``, aligned with
        ``ids``; the new snapshot's own), everything else shared: the same ledgers, health
        and placements."""
        new = self.with_arrays(cap=self.cap, has_ledger=self.has_ledger, reserved=reserved,
                               fresh=self.fresh)
        object.__setattr__(new, "_placed", self._placed)
        return new

    def _placed_index(
        self, placed: Iterable[PlacedTask]
    ) -> dict[str, list[tuple[Items, np.ndarray, np.ndarray | int]]]:
        """Return the placed tasks by tenant as (labels, pool indexes, members per index: an
        array aligned with the indexes, or 1 for each), skipping unknown pools."""
        pos = self.pos
        out: dict[str, list[tuple[Items, np.ndarray, np.ndarray | int]]] = {}
        for t in placed:
            pool_ids, members = t.pool_ids, t.members
            if members and len(members) != len(pool_ids):
                raise ValueError(f"{t.task_id}: one member count per pool expected")
            try:
                idx = np.fromiter(map(pos.__getitem__, pool_ids), np.intp, len(pool_ids))
                weights: np.ndarray | int = np.array(members, dtype=np.int64) if members else 1
            except KeyError:
                known = [i for i, p in enumerate(pool_ids) if p in pos]
                idx = np.array([pos[pool_ids[i]] for i in known], dtype=np.intp)
                weights = np.array([members[i] for i in known], dtype=np.int64) if members else 1
            if len(idx):
                entry = (frozenset(t.labels.items()), idx, weights)
                out.setdefault(t.tenant_id, []).append(entry)
        return out

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_memo" and hasattr(self, "_memo"):
            raise AttributeError("Snapshot is immutable")
        object.__setattr__(self, name, value)

    # --- memo tables -------------------------------------------------------------------------

    def memoized(self, key: tuple, build: Callable[..., T], *args: Any) -> T:
        """Return the memo entry at ``key``, building and storing it on first use.

        ``build(*args)`` must be a pure function of this snapshot (and of what ``key`` names). The
        first item of ``key`` is the entry's kind: ``with_usage`` carries over the kinds computed
        from static columns only (``"sel"``, ``"art"``, ``"tenant_mask"``), ``"static"`` (the
        static filters' verdicts) and ``"class"`` (the placement classes' states) when
        heartbeat freshness and ledger presence held, and no other kind.
        """
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = build(*args)
        return hit

    @property
    def memo_size(self) -> int:
        """Return how many memo entries this snapshot holds."""
        return len(self._memo)

    # --- derived arrays (memoized; pure functions of the snapshot) ---------------------------

    def visible(self, tenant_id: str) -> np.ndarray:
        """Return the indexes of the pools that list ``tenant_id`` (sorted by pool id)."""
        return self.by_tenant.get(tenant_id, _EMPTY)

    def tenant_mask(self, tenant_id: str) -> np.ndarray:
        """Return a bool mask of the pools that list ``tenant_id``."""
        key = ("tenant_mask", tenant_id)
        mask = self._memo.get(key)
        if mask is None:
            mask = np.zeros(self.n, dtype=bool)
            mask[self.visible(tenant_id)] = True
            self._memo[key] = mask
        return mask

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

    def has_placements(self, tenant_id: str) -> bool:
        """Return whether the snapshot holds actual placements of ``tenant_id`` (it reads them
        only for some tenants: see ``placed``)."""
        return bool(self._placed.get(tenant_id))

    def placed_members(
        self, tenant_id: str, selector: Items | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Return the pools of the tenant's actual placements that match ``selector`` (None:
        all), once per placement and pool, and the members each holds there (None: one
        each): what per-pool or per-domain counts are counted from, in one call."""
        key = ("placed", tenant_id, selector)
        hit = self._memo.get(key)
        if hit is None:
            matched = [(idx, weights) for labels, idx, weights in self._placed.get(tenant_id, ())
                       if selector is None or selector <= labels]
            if not matched:
                hit = (_EMPTY, None)
            else:
                idx = (matched[0][0] if len(matched) == 1
                       else np.concatenate([i for i, _ in matched]))
                members = None
                if any(not isinstance(w, int) or w != 1 for _, w in matched):
                    members = np.concatenate([
                        np.full(len(i), w, dtype=np.int64) if isinstance(w, int) else w
                        for i, w in matched])
                hit = (idx, members)
            self._memo[key] = hit
        return hit


#: Attributes that depend only on the pools' static columns (shared by ``with_usage``).
_STATIC_SLOTS = (
    "_built", "instance_of", "ids", "pos", "n", "strategy", "status", "ready", "rc", "rc_table",
    "region", "region_table", "residency", "residency_table", "fd", "fd_table", "cost",
    "by_tenant", "audience", "_label_idx", "_artifact_idx",
)
#: Memo kinds computed from static columns only (selector, artifact and tenant masks).
_MEMO_STATIC = frozenset({"sel", "art", "tenant_mask"})
#: Memo kinds that also read heartbeat freshness and ledger presence: the static filters'
#: verdicts and the placement classes' states (which re-read ledger totals themselves).
_MEMO_HEALTH = frozenset({"static", "class"})
#: At most this many memo entries carry over to a snapshot built by ``with_usage``.
MEMO_CARRIED = 4096

_EMPTY = np.zeros(0, dtype=np.intp)
_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    a = _ARANGE.get(n)
    if a is None:
        a = _ARANGE[n] = np.arange(n, dtype=np.intp)
    return a
