"""Queue positions: where a waiting task stands under each policy, from a snapshot of the
competing queue of its runtime class. Pure (no I/O).

A :class:`ClassQueue` holds the oldest ``limit`` competing tasks of one runtime class (read
in one bounded range, see :mod:`app.ledger.queue`) with per-policy sorted keys, so that each
position is a few binary searches:

* ``fifo``: the tasks admitted earlier;
* ``priority``: the tasks of higher effective priority ``priority + wait / aging``. Both
  sides age at the same rate, so the order is that of ``priority - admitted / aging``: it does
  not change with time (admission order on a tie);
* ``fair``: dominant-resource fairness between tenants of equal shares is a round robin in
  tenant-id order (its tie-break): with ``k`` of its own tenant's tasks ahead, each other
  tenant is ahead with ``min(n, k)`` tasks, ``min(n, k + 1)`` when its id sorts first.

**Who competes with whom.** A task competes only with the tasks whose tenant can use at
least one pool its own tenant can use (a pool of the class that lists both tenants): the
snapshot carries the tenant lists of the class's pools, and a position counts only the
tasks of those tenants, so no tenant learns the volume of tenants it shares no pool with.
Each index is kept per tenant, so restricting costs one binary search per competing tenant.

When the class has more competitors than the snapshot holds (``complete`` False), counts
are lower bounds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = ["ClassQueue", "Position"]


@dataclass(frozen=True, slots=True)
class Position:
    """Tasks ahead under the policy, competing tasks, and whether both are exact."""

    ahead: int
    competing: int
    exact: bool


class ClassQueue:
    """The oldest competing tasks of one runtime class, indexed for each policy.

    The columns are in admission order (ascending ``seq``). The index a policy needs is
    built on its first position, so a process serving one policy pays for that one only.
    """

    __slots__ = ("_competitors", "_prio", "_tenants", "admitted", "aging_seconds", "complete",
                 "pool_tenants", "priorities", "seqs", "tenant_ids")

    def __init__(
        self,
        *,
        seqs: Sequence[int],
        tenant_ids: Sequence[str],
        priorities: Sequence[int],
        admitted: Sequence[float],
        complete: bool,
        aging_seconds: float = 60.0,
        pool_tenants: Iterable[Iterable[str]] | None = None,
    ) -> None:
        self.seqs = seqs
        self.tenant_ids = tenant_ids
        self.priorities = priorities
        #: ``admitted_at`` as seconds since the epoch (``datetime.timestamp()``).
        self.admitted = admitted
        #: False when the class has more competitors than the snapshot holds.
        self.complete = complete
        self.aging_seconds = aging_seconds
        #: The tenant lists of the class's pools (None: every task competes with every other).
        self.pool_tenants = (
            None if pool_tenants is None else [frozenset(t) for t in pool_tenants]
        )
        self._prio: dict[str, list[tuple[float, int]]] | None = None
        self._tenants: dict[str, list[int]] | None = None
        self._competitors: dict[str, frozenset[str] | None] = {}

    def _priority_key(self, priority: int, admitted: float, seq: int) -> tuple[float, int]:
        # Ascending sort = descending effective priority, then admission order.
        return (admitted / self.aging_seconds - priority, seq)

    def _priority_index(self) -> dict[str, list[tuple[float, int]]]:
        if self._prio is None:
            by_tenant: dict[str, list[tuple[float, int]]] = {}
            for tenant, key in zip(
                self.tenant_ids,
                map(self._priority_key, self.priorities, self.admitted, self.seqs),
                strict=True,
            ):
                by_tenant.setdefault(tenant, []).append(key)
            for keys in by_tenant.values():
                keys.sort()
            self._prio = by_tenant
        return self._prio

    def _tenant_index(self) -> dict[str, list[int]]:
        if self._tenants is None:
            tenants: dict[str, list[int]] = {}
            for seq, tenant in zip(self.seqs, self.tenant_ids, strict=True):
                tenants.setdefault(tenant, []).append(seq)
            self._tenants = tenants
        return self._tenants

    def competitors(self, tenant_id: str) -> frozenset[str] | None:
        """Return the tenants whose tasks compete with ``tenant_id``'s: those listed on a pool
        of the class that lists it (itself always); None when every tenant competes."""
        if self.pool_tenants is None:
            return None
        if tenant_id not in self._competitors:
            tenants = {tenant_id}
            for listed in self.pool_tenants:
                if tenant_id in listed:
                    tenants.update(listed)
            # None when no one is left out: the whole snapshot counts.
            self._competitors[tenant_id] = (
                None if tenants.issuperset(self._tenant_index()) else frozenset(tenants)
            )
        return self._competitors[tenant_id]

    def position(
        self, *, seq: int, tenant_id: str, priority: int, admitted_at: datetime, policy: str
    ) -> Position:
        """Return where a task (competing or not) stands among the snapshot's tasks of the
        tenants it competes with."""
        by_tenant = self._tenant_index()
        rivals = self.competitors(tenant_id)
        tenants = by_tenant.keys() if rivals is None else rivals.intersection(by_tenant)
        competing = (
            len(self.seqs) if rivals is None else sum(len(by_tenant[t]) for t in tenants)
        )
        if policy == "priority":
            key = self._priority_key(priority, admitted_at.timestamp(), seq)
            keys = self._priority_index()
            ahead = sum(bisect_left(keys[t], key) for t in tenants)
        elif policy == "fair":
            own = bisect_left(by_tenant.get(tenant_id, []), seq)
            ahead = own + sum(
                min(len(by_tenant[other]), own + (1 if other < tenant_id else 0))
                for other in tenants if other != tenant_id
            )
        elif rivals is None:
            ahead = bisect_left(self.seqs, seq)
        else:
            ahead = sum(bisect_left(by_tenant[t], seq) for t in tenants)
        return Position(ahead=ahead, competing=competing, exact=self.complete)
