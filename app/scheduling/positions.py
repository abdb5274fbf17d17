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

When the class has more competitors than the snapshot holds (``complete`` False), counts
are lower bounds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
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

    __slots__ = ("_prio", "_tenants", "admitted", "aging_seconds", "complete", "priorities",
                 "seqs", "tenant_ids")

    def __init__(
        self,
        *,
        seqs: Sequence[int],
        tenant_ids: Sequence[str],
        priorities: Sequence[int],
        admitted: Sequence[float],
        complete: bool,
        aging_seconds: float = 60.0,
    ) -> None:
        self.seqs = seqs
        self.tenant_ids = tenant_ids
        self.priorities = priorities
        #: ``admitted_at`` as seconds since the epoch (``datetime.timestamp()``).
        self.admitted = admitted
        #: False when the class has more competitors than the snapshot holds.
        self.complete = complete
        self.aging_seconds = aging_seconds
        self._prio: list[tuple[float, int]] | None = None
        self._tenants: dict[str, list[int]] | None = None

    def _priority_key(self, priority: int, admitted: float, seq: int) -> tuple[float, int]:
        # Ascending sort = descending effective priority, then admission order.
        return (admitted / self.aging_seconds - priority, seq)

    def _priority_index(self) -> list[tuple[float, int]]:
        if self._prio is None:
            self._prio = sorted(
                map(self._priority_key, self.priorities, self.admitted, self.seqs)
            )
        return self._prio

    def _tenant_index(self) -> dict[str, list[int]]:
        if self._tenants is None:
            tenants: dict[str, list[int]] = {}
            for seq, tenant in zip(self.seqs, self.tenant_ids, strict=True):
                tenants.setdefault(tenant, []).append(seq)
            self._tenants = tenants
        return self._tenants

    def position(
        self, *, seq: int, tenant_id: str, priority: int, admitted_at: datetime, policy: str
    ) -> Position:
        """Return where a task (competing or not) stands among the snapshot's tasks."""
        if policy == "priority":
            key = self._priority_key(priority, admitted_at.timestamp(), seq)
            ahead = bisect_left(self._priority_index(), key)
        elif policy == "fair":
            by_tenant = self._tenant_index()
            own = bisect_left(by_tenant.get(tenant_id, []), seq)
            ahead = own + sum(
                min(len(seqs), own + (1 if other < tenant_id else 0))
                for other, seqs in by_tenant.items() if other != tenant_id
            )
        else:
            ahead = bisect_left(self.seqs, seq)
        return Position(ahead=ahead, competing=len(self.seqs), exact=self.complete)
