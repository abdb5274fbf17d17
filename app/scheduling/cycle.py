"""The state of one ``select`` call (the CycleState of the pipeline): the compiled spec, the
snapshot, the pass overlay and the per-call memo of derived arrays (the pools' capacity and
projected need, affinity domain counts) that several plugins read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from app.scheduling.assumed import Assumed, request_row
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec, CompiledTerm, Items

__all__ = ["Cycle", "tenant_domain_counts"]

T = TypeVar("T")
_MISSING = object()


class Cycle:
    """Per-call state shared by the plugins of one ``select``."""

    __slots__ = (
        "spec", "snapshot", "assumed", "req", "notes", "held", "class_pools", "_terms",
        "_rows", "_kept", "_position",
    )

    def __init__(
        self,
        spec: CompiledSpec,
        snapshot: Snapshot,
        assumed: Assumed | None,
        holds: Mapping[str, tuple[int, int, int]] | None = None,
    ) -> None:
        if assumed is not None and assumed.snapshot is not snapshot:
            raise ValueError("assumed overlay belongs to another snapshot")
        self.spec = spec
        self.snapshot = snapshot
        self.assumed = assumed
        self.req = request_row(spec.requests)
        #: What a plugin's ``score_many`` computed that its ``describe`` may read back.
        self.notes: dict[str, Any] = {}
        #: Capacity the task itself holds (a preemptor's nominated capacity), per pool; it is
        #: in the ledger's reserved amounts but usable by this task. None: holds nothing.
        self.held: np.ndarray | None = None
        if holds:
            self.held = np.zeros((snapshot.n, 3), dtype=np.int64)
            for pool_id, amount in holds.items():
                i = snapshot.pos.get(pool_id)
                if i is not None:
                    self.held[i] += np.array(amount, dtype=np.int64)
        #: The pools of the spec's placement class, their capacity rows and the class's
        #: PreScore memo, when the pipeline knows them (see :meth:`class_memo`).
        self.class_pools: tuple[np.ndarray, np.ndarray, dict] | None = None
        self._terms: dict[tuple, tuple[np.ndarray, np.ndarray | None, int]] = {}
        #: The pools last asked for by :meth:`capacity_and_need`, with the answer.
        self._rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        #: The pools left by the per-task filters and their positions among the class's.
        self._kept: tuple[np.ndarray, np.ndarray] | None = None
        #: The last answer of :meth:`position`.
        self._position: tuple[np.ndarray, int, int | None] | None = None

    def used(self, idx: np.ndarray) -> np.ndarray:
        """Return reserved plus assumed usage of the pools at ``idx`` (rows of 3 ints), less
        what the task itself holds there."""
        used = (self.snapshot.reserved if self.assumed is None else self.assumed.used).take(
            idx, axis=0
        )
        if self.held is not None:
            return used - self.held.take(idx, axis=0)
        return used

    def capacity_and_need(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the capacity rows of the pools at ``idx`` and their projected need: actual
        plus assumed usage plus one member's request (less what the task holds there).

        The answer for the same ``idx`` array is computed once per call (the capacity filter
        and the load score both read it); read-only.
        """
        rows = self._rows
        if rows is not None and rows[0] is idx:
            return rows[1], rows[2]
        pools = self.class_pools
        if pools is not None and pools[0] is idx:
            cap = pools[1]
        else:
            cap = self.snapshot.cap.take(idx, axis=0)
        need = self.used(idx)
        need += self.req
        self._rows = (idx, cap, need)
        return cap, need

    def class_memo(
        self,
        idx: np.ndarray,
        key: Any,
        build: Callable[..., T],
        *args: Any,
        narrow: Callable[[T, np.ndarray], T] | None = None,
    ) -> T:
        """Return ``build(*args)``, computed once per placement class and ledger totals when
        ``idx`` is the class's pools (PreScore state: ``build`` must read only those pools'
        capacities and static columns). When ``idx`` is what the per-task filters left of
        them (:meth:`narrow`), ``narrow(state, positions)`` derives it from the class's
        state (it must equal ``build`` on those pools); else it is computed for this call."""
        pools = self.class_pools
        if pools is None:
            return build(*args)
        if pools[0] is not idx:
            kept = self._kept
            if narrow is None or kept is None or kept[0] is not idx:
                return build(*args)
            state = pools[2].get(key, _MISSING)
            return build(*args) if state is _MISSING else narrow(state, kept[1])
        memo = pools[2]
        hit = memo.get(key, _MISSING)
        if hit is _MISSING:
            hit = memo[key] = build(*args)
        return hit

    def narrow(self, idx: np.ndarray, keep: np.ndarray, kept: np.ndarray) -> None:
        """Record that a filter left ``kept`` = ``idx[keep]`` of the pools at ``idx``: what
        this call computed for ``idx`` is narrowed rather than computed again."""
        rows = self._rows
        if rows is not None and rows[0] is idx:
            self._rows = (kept, rows[1][keep], rows[2][keep])
        pools = self.class_pools
        if pools is not None and pools[0] is idx:
            self._kept = (kept, keep.nonzero()[0])
        elif self._kept is not None and self._kept[0] is idx:
            self._kept = (kept, self._kept[1][keep])

    def position(self, idx: np.ndarray, pool: int) -> int | None:
        """Return the position of the pool at snapshot index ``pool`` in ``idx`` (ascending
        snapshot indexes), or None when it is not there. The last answer is kept (or the one
        :meth:`describing` gave): the plugins describing one pool search once, if at all."""
        last = self._position
        if last is not None and last[0] is idx and last[1] == pool:
            return last[2]
        pos = int(idx.searchsorted(pool))
        found = pos if pos < len(idx) and idx.item(pos) == pool else None
        self._position = (idx, pool, found)
        return found

    def noted(self, name: str, pool: int) -> int | float | None:
        """Return the raw score the plugin ``name`` noted for the pool at snapshot index
        ``pool`` in this cycle's scoring (``notes[name] = (idx, raw)``), or None when it
        noted none for that pool."""
        note = self.notes.get(name)
        if note is None:
            return None
        idx, raw = note
        pos = self.position(idx, pool)
        return None if pos is None else raw.item(pos)

    def describing(self, idx: np.ndarray, at: int) -> int:
        """Note that the pool at position ``at`` of the scored pools ``idx`` is described next
        (:meth:`position` then needs no search) and return its snapshot index."""
        pool = idx.item(at)
        self._position = (idx, pool, at)
        return pool

    def available(self, idx: np.ndarray) -> np.ndarray:
        """Return the capacity left on the pools at ``idx`` after actual and assumed usage."""
        cap, need = self.capacity_and_need(idx)
        return cap - need + self.req

    def slots(self, idx: np.ndarray) -> np.ndarray:
        """Return how many members of the spec fit on each pool at ``idx``."""
        avail = self.available(idx)
        positive = self.req > 0
        if not positive.any():
            return np.full(len(idx), np.iinfo(np.int64).max // 4, dtype=np.int64)
        per = np.maximum(avail[:, positive], 0) // self.req[positive]
        return per.min(axis=1)

    def term_counts(self, term: CompiledTerm) -> tuple[np.ndarray, int]:
        """Return per pool the matching placements in its topology domain, and the total.

        Placements are the tenant's actual ones plus those assumed in this pass.
        """
        table, codes, total = self.term_table(term)
        return (table if codes is None else table[codes]), total

    def term_counts_at(self, term: CompiledTerm, idx: np.ndarray) -> tuple[np.ndarray, int]:
        """Return :meth:`term_counts` at the pools ``idx`` only (what the plugins read): the
        counts per domain gathered at the pools' domains, no array over every pool."""
        table, codes, total = self.term_table(term)
        return table.take(idx if codes is None else codes.take(idx)), total

    def term_table(self, term: CompiledTerm) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Return the term's matching placements (actual and assumed) per topology domain,
        each pool's domain code (None: the table is per pool), and their total.

        The actual placements' table is memoized on the snapshot; this pass's assumed ones
        are added per call, by domain (a bincount over the few pools they are on)."""
        key = (term.selector, term.topology)
        hit = self._terms.get(key)
        if hit is not None:
            return hit
        snap = self.snapshot
        tenant = self.spec.tenant_id
        table, total = snap.memoized(
            ("domt", tenant, term.selector, term.topology),
            _term_table, snap, tenant, term.selector, term.topology,
        )
        codes, nd = _codes(snap, term.topology)
        if self.assumed is not None:
            extra = self.assumed.placed_counts(tenant, term.selector)
            if extra is not None:
                at, weights = extra
                total += int(weights.sum())
                if codes is None:
                    table = table.copy()
                    table[at] += weights
                else:
                    table = table + np.bincount(
                        codes.take(at), weights=weights, minlength=nd
                    ).astype(np.int64)
        hit = self._terms[key] = (table, codes, total)
        return hit

    def tenant_domain_counts(self, topology: str) -> tuple[np.ndarray, np.ndarray]:
        """Return each pool's ``topology`` domain code and, per domain, the tenant's placed
        members (actual and assumed): ``per_domain[codes[i]]`` is pool ``i``'s count. The
        counts follow the pass's later placements: read them at once."""
        return tenant_domain_counts(self.snapshot, self.assumed, self.spec.tenant_id, topology)


def tenant_domain_counts(
    snapshot: Snapshot, assumed: Assumed | None, tenant_id: str, topology: str
) -> tuple[np.ndarray, np.ndarray]:
    """Return each pool's ``topology`` domain code and, per domain, the members of the
    tenant's actual placements plus those assumed in ``assumed`` (which keeps the sum up to
    date with its later placements: read it at once)."""
    dom = snapshot.domains(topology)[0]
    per_domain = snapshot.memoized(
        ("tdomd", tenant_id, topology), _tenant_domains, snapshot, tenant_id, topology
    )
    if assumed is not None:
        per_domain = assumed.domain_totals(tenant_id, topology, per_domain)
    return dom, per_domain


def _codes(snapshot: Snapshot, topology: str) -> tuple[np.ndarray | None, int]:
    """Return each pool's ``topology`` domain code and the number of domains; None when
    domains are pools (``to_domains`` leaves per-pool counts as they are)."""
    if topology == "pool":
        return None, snapshot.n
    dom, nd = snapshot.domains(topology)
    return (None, nd) if nd == 0 else (dom, nd)


def _term_table(
    snapshot: Snapshot, tenant_id: str, selector: Items, topology: str
) -> tuple[np.ndarray, int]:
    """Return per ``topology`` domain (per pool: see ``_codes``) the tenant's actual
    placements matching ``selector``, and their total."""
    codes, nd = _codes(snapshot, topology)
    size = snapshot.n if codes is None else nd
    if not snapshot.has_placements(tenant_id):
        # What the count of no placements gives, without a pass over every pool.
        return np.zeros(size, dtype=np.int64), 0
    idx, members = snapshot.placed_members(tenant_id, selector)
    total = len(idx) if members is None else int(np.add.reduce(members))
    # One count over the matching placements' pools (or their domains): a few, however many
    # pools there are.
    table = np.bincount(idx if codes is None else codes.take(idx), weights=members,
                        minlength=size)
    return table.astype(np.int64, copy=False), total


def _tenant_domains(snapshot: Snapshot, tenant_id: str, topology: str) -> np.ndarray:
    """Return per ``topology`` domain the members of the tenant's actual placements."""
    dom, nd = snapshot.domains(topology)
    if not snapshot.has_placements(tenant_id):
        # What the count of no placements gives, without a pass over every pool.
        return np.zeros(nd, dtype=np.int64)
    idx, members = snapshot.placed_members(tenant_id, None)
    return np.bincount(dom.take(idx), weights=members, minlength=nd).astype(np.int64)
