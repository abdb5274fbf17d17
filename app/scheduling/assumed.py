"""The assumed-usage overlay of one pass: placements decided but not yet committed.

A pass records each decision in its :class:`Assumed` so that the tasks after it see its usage
(capacity) and its labels (affinity and spreading). The overlay belongs to one snapshot and is
the only mutable state the core keeps; a reservation that loses its race is removed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from app.scheduling.snapshot import Snapshot
    from app.scheduling.spec import CompiledSpec, Items

__all__ = ["Assumed", "request_row"]


@dataclass(slots=True)
class _AssumedEntry:
    tenant_id: str
    labels: Items
    idx: np.ndarray
    counts: np.ndarray
    requests: np.ndarray
    #: The pool index and member count of a one-pool placement as ints (pool -1: several).
    pool: int
    count: int


_ONE = np.ones(1, dtype=np.int64)
_ONE.flags.writeable = False
_SINGLE: dict[int, np.ndarray] = {}
_FD = "failureDomain"


#: Requests as read-only int64 rows, by value (a few dozen distinct ones, shared by the tasks
#: that ask the same).
_REQUESTS: dict[tuple[int, int, int], np.ndarray] = {}


def request_row(requests: tuple[int, int, int]) -> np.ndarray:
    """Return ``requests`` as a shared read-only int64 array."""
    row = _REQUESTS.get(requests)
    if row is None:
        if len(_REQUESTS) >= 4096:
            _REQUESTS.clear()
        row = _REQUESTS[requests] = np.array(requests, dtype=np.int64)
        row.flags.writeable = False
    return row


def _single(i: int) -> np.ndarray:
    """Return the read-only index array ``[i]`` (shared: most placements have one pool)."""
    a = _SINGLE.get(i)
    if a is None:
        a = _SINGLE[i] = np.array((i,), dtype=np.intp)
        a.flags.writeable = False
    return a


class Assumed:
    """The mutable overlay of one pass: usage and placements decided but not yet committed."""

    __slots__ = ("snapshot", "used", "version", "_entries", "_by_tenant", "_domains", "_holds")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        #: Reserved plus assumed usage per pool (``snapshot.reserved + usage``): the one array
        #: ``add``, ``hold`` and ``remove`` update.
        self.used = snapshot.reserved.copy()
        self.version = 0
        self._entries: dict[str, _AssumedEntry] = {}
        self._by_tenant: dict[str, dict[str, _AssumedEntry]] = {}
        # Per tenant and topology, the members of its actual and assumed placements per
        # domain, kept up to date by add/remove once asked for (see ``domain_totals``).
        self._domains: dict[str, dict[str, np.ndarray]] = {}
        #: Capacity held (not placed) per task: a preemptor's share of the free capacity.
        self._holds: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def usage(self) -> np.ndarray:
        """Return the assumed usage per pool (placements and holds), a new array."""
        return self.used - self.snapshot.reserved

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._entries

    def add(
        self,
        spec: CompiledSpec,
        members: Sequence[tuple[str, int]],
        *,
        task_id: str | None = None,
    ) -> None:
        """Record a decided placement: its usage and its labels for later affinity checks.

        ``task_id`` names the task when ``spec`` is a compiled spec shared by several tasks
        (its own ``task_id`` unset).
        """
        task_id = task_id or spec.task_id
        if task_id is None:
            raise ValueError("an assumed placement needs a task id")
        entries = self._entries
        if task_id in entries:
            self.remove(task_id)
        req = request_row(spec.requests)
        tenant_id = spec.tenant_id
        if len(members) == 1:
            # One pool (every task but a spread gang): a row update in place, no scatter-add,
            # and the tracked domain counts updated by item.
            (pool_id, count), = members
            i = self.snapshot.pos[pool_id]
            row = self.used[i]  # a view: the pool's row, updated in place
            if count == 1:
                row += req
            else:
                row += req * count
            if count == 1:
                entry = _AssumedEntry(tenant_id, spec.labels, _single(i), _ONE, req, i, 1)
            else:
                entry = _AssumedEntry(tenant_id, spec.labels, _single(i),
                                      np.array((count,), dtype=np.int64), req, i, count)
            entries[task_id] = entry
            by_task = self._by_tenant.get(tenant_id)
            if by_task is None:
                by_task = self._by_tenant[tenant_id] = {}
            by_task[task_id] = entry
            tracked = self._domains.get(tenant_id)
            if tracked:
                if len(tracked) == 1 and _FD in tracked:
                    per_domain = tracked[_FD]
                    d = self.snapshot.fd.item(i)
                    per_domain[d] = per_domain.item(d) + count
                else:
                    self._domains_update(entry, 1)
            self.version += 1
            return
        pos = self.snapshot.pos
        idx = np.array([pos[p] for p, _ in members], dtype=np.intp)
        counts = np.array([c for _, c in members], dtype=np.int64)
        np.add.at(self.used, idx, counts[:, None] * req)
        entry = _AssumedEntry(tenant_id, spec.labels, idx, counts, req, -1, 0)
        entries[task_id] = entry
        by_task = self._by_tenant.get(tenant_id)
        if by_task is None:
            by_task = self._by_tenant[tenant_id] = {}
        by_task[task_id] = entry
        if self._domains.get(tenant_id):
            self._domains_update(entry, 1)
        self.version += 1

    def hold(self, task_id: str, amounts: Sequence[tuple[str, tuple[int, int, int]]]) -> None:
        """Record capacity a task holds without being placed (a preemptor's nomination of the
        free part it needs): later tasks of the pass see it used; no labels, no members."""
        self.remove(task_id)
        pos = self.snapshot.pos
        idx = np.array([pos[p] for p, _ in amounts], dtype=np.intp)
        vec = np.array([a for _, a in amounts], dtype=np.int64).reshape(len(idx), 3)
        np.add.at(self.used, idx, vec)
        self._holds[task_id] = (idx, vec)
        self.version += 1

    def remove(self, task_id: str) -> None:
        """Undo an assumed placement or hold (its reservation lost a race or was not applied)."""
        held = self._holds.pop(task_id, None)
        if held is not None:
            np.subtract.at(self.used, held[0], held[1])
            self.version += 1
        entry = self._entries.pop(task_id, None)
        if entry is None:
            return
        np.subtract.at(self.used, entry.idx, entry.counts[:, None] * entry.requests)
        del self._by_tenant[entry.tenant_id][task_id]
        self._domains_update(entry, -1)
        self.version += 1

    def _domains_update(self, entry: _AssumedEntry, sign: int) -> None:
        tracked = self._domains.get(entry.tenant_id)
        if tracked:
            pool = entry.pool
            for topology, per_domain in tracked.items():
                dom, _ = self.snapshot.domains(topology)
                if pool >= 0:
                    per_domain[dom[pool]] += sign * entry.count
                else:
                    np.add.at(per_domain, dom[entry.idx], sign * entry.counts)

    def domain_totals(self, tenant_id: str, topology: str, actual: np.ndarray) -> np.ndarray:
        """Return per ``topology`` domain (indexed by ``Snapshot.domains`` codes) ``actual``,
        the members of the tenant's actual placements, plus those of its assumed placements.

        Once asked for, the sum is kept up to date by add and remove (spreading reads it for
        every task): read it at once, never keep it, and pass the same ``actual`` every time.
        """
        tracked = self._domains.get(tenant_id)
        if tracked is None:
            tracked = self._domains[tenant_id] = {}
        per_domain = tracked.get(topology)
        if per_domain is None:
            per_domain = actual.copy()
            entries = self._by_tenant.get(tenant_id)
            if entries:
                dom = self.snapshot.domains(topology)[0]
                for e in entries.values():
                    np.add.at(per_domain, dom[e.idx], e.counts)
            tracked[topology] = per_domain
        return per_domain

    def placed_counts(
        self, tenant_id: str, selector: Items | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Return the pools holding members of the tenant's assumed placements that match
        ``selector`` (None: all), ascending, and the members on each; None when there are
        none. Sparse: a pass assumes a few placements per tenant, on a few of the pools."""
        entries = self._by_tenant.get(tenant_id)
        if not entries:
            return None
        members: dict[int, int] = {}
        for e in entries.values():
            if selector is None or selector <= e.labels:
                if e.pool >= 0:
                    members[e.pool] = members.get(e.pool, 0) + e.count
                else:
                    for i, c in zip(e.idx.tolist(), e.counts.tolist(), strict=True):
                        members[i] = members.get(i, 0) + c
        if not members:
            return None
        pools = sorted(members)
        return (np.array(pools, dtype=np.intp),
                np.array([members[i] for i in pools], dtype=np.int64))
