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
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["ClassQueue", "Position"]


@dataclass(frozen=True, slots=True)
class Position:
    """Tasks ahead under the policy, competing tasks, and whether both are exact."""

    ahead: int
    competing: int
    exact: bool


@dataclass(frozen=True, slots=True)
class ClassQueue:
    """The oldest competing tasks of one runtime class, indexed for each policy."""

    #: (seq, tenant, priority, admitted_at) in admission order.
    entries: Sequence[tuple[int, str, int, datetime]]
    #: False when the class has more competitors than ``entries``.
    complete: bool
    aging_seconds: float = 60.0
    _seqs: list[int] = field(init=False, repr=False)
    _prio: list[tuple[float, int]] = field(init=False, repr=False)
    _tenants: dict[str, list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        seqs = [e[0] for e in self.entries]
        prio = sorted(self._priority_key(e[2], e[3], e[0]) for e in self.entries)
        tenants: dict[str, list[int]] = {}
        for seq, tenant, _, _ in self.entries:
            tenants.setdefault(tenant, []).append(seq)
        object.__setattr__(self, "_seqs", seqs)
        object.__setattr__(self, "_prio", prio)
        object.__setattr__(self, "_tenants", tenants)

    def _priority_key(self, priority: int, admitted_at: datetime, seq: int) -> tuple[float, int]:
        # Ascending sort = descending effective priority, then admission order.
        return (admitted_at.timestamp() / self.aging_seconds - priority, seq)

    def position(
        self, *, seq: int, tenant_id: str, priority: int, admitted_at: datetime, policy: str
    ) -> Position:
        """Return where a task (competing or not) stands among the snapshot's tasks."""
        if policy == "priority":
            ahead = bisect_left(self._prio, self._priority_key(priority, admitted_at, seq))
        elif policy == "fair":
            own = bisect_left(self._tenants.get(tenant_id, []), seq)
            ahead = own + sum(
                min(len(seqs), own + (1 if other < tenant_id else 0))
                for other, seqs in self._tenants.items() if other != tenant_id
            )
        else:
            ahead = bisect_left(self._seqs, seq)
        return Position(ahead=ahead, competing=len(self.entries), exact=self.complete)
