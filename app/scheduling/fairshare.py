"""Weighted fair sharing of borrowed capacity: the share of a node, and the order in which a
pass admits the tasks that must borrow.

**The share** (:func:`~app.scheduling.shares.share_of`, of the nodes the quota book
describes: :class:`~app.scheduling.plugins.quota.QuotaNode`). In a managed runtime class, a
node of the quota tree (a tenant, or a cohort above it) borrows, per resource, what it uses
above its nominal (a cohort: its cap). What its parent *can lend* is the most the parent
can make available to its members (what of its cap it keeps, plus what its own parent can
make available, within its limit; a root: its cap): a figure the pass's placements do not
move, so a tenant's share moves only with its own usage, a cohort's with its subtree's. A
node's share is its **dominant borrowed resource**, ``max(borrowed / can lend)`` over the
resources its parent can lend, divided by its ``fairWeight``; 0 when it borrows nothing.

**The order** (:func:`fair_order`). The pass's tasks come in the policy's order. A task
whose tenant is within its nominal with the task keeps its place. Where the next task in
that order must borrow, the pass takes instead, among the first waiting task of each
tenant of the same runtime class that must borrow too, the one of the highest priority,
then of the lowest share with the task (compared level by level from the top of the
tree: :meth:`FairShares.key`), then the first in the policy's order. Shares are read
from the pass's quota book as it places work, so a pass that places many tasks divides
the borrowed capacity among tenants by weight rather than giving it to the first. With a
usage half-life set, the share a tenant is ordered by is its decayed usage's instead
(see :class:`FairShares`). When no tenant's usage plus all its tasks of the pass goes above
its nominal, no task can have to borrow and the order is the policy's, with nothing ranked.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from app.scheduling.shares import share_of

if TYPE_CHECKING:
    from app.scheduling.plugins.quota import QuotaBook
    from app.scheduling.records import ClaimedTask
    from app.scheduling.spec import CompiledSpec

__all__ = ["FairKey", "FairShares", "fair_order"]

#: The ordering key of a tenant: (share, node id) per level, from the top of its path down.
FairKey = tuple[tuple[float, str], ...]


class FairShares:
    """The shares of a pass's tenants and cohorts in its managed runtime classes, read from
    its quota book (which follows the pass's placements and knows the tree and the weights),
    and, when a usage half-life is set, the tenants' decayed usage.

    With ``decayed`` (per (tenant, class), an exponentially decayed average of its usage
    per resource), the share a tenant is ordered by is that of its decayed usage plus what
    the pass placed for it so far: a tenant that consumed more recently waits behind one
    that did not.
    """

    __slots__ = ("_book", "_decayed", "_placed", "_versions", "version")

    def __init__(
        self, book: QuotaBook, *,
        decayed: Mapping[tuple[str, str], Sequence[float]] | None = None,
    ) -> None:
        self._book = book
        self._decayed = decayed
        #: What the pass placed per (tenant, class) (with decay: added to the decayed usage).
        self._placed: dict[tuple[str, str], list[int]] = {}
        #: Placements counted so far, in all and per (tenant, class): a tenant's own share
        #: moves only with its own placements, a cohort's with any below it.
        self.version = 0
        self._versions: dict[tuple[str, str], int] = {}

    def placed(self, tenant_id: str, runtime_class: str, need: Sequence[int]) -> None:
        """Count a placement of the pass (with decay: in the decayed usage too)."""
        key = (tenant_id, runtime_class)
        self.version += 1
        self._versions[key] = self._versions.get(key, 0) + 1
        if self._decayed is None:
            return
        acc = self._placed.setdefault(key, [0, 0, 0])
        for i, n in enumerate(need):
            acc[i] += n

    def version_of(self, tenant_id: str, runtime_class: str) -> int:
        """Return how many placements of the tenant in the class were counted."""
        return self._versions.get((tenant_id, runtime_class), 0)

    def share(
        self, tenant_id: str, runtime_class: str, need: Sequence[int] = (0, 0, 0)
    ) -> float:
        """Return the tenant's share in the class now, with ``need`` more (with decay: the
        share of its decayed usage)."""
        used: list[float] | None = None
        if self._decayed is not None:
            key = (tenant_id, runtime_class)
            used = list(self._decayed.get(key, (0.0, 0.0, 0.0)))
            for i, n in enumerate(self._placed.get(key, (0, 0, 0))):
                used[i] += n
        borrowed, lendable = self._book.borrowing(tenant_id, runtime_class, used, need)
        return share_of(borrowed, lendable, self._book.tenant_weight(tenant_id))

    def key(self, tenant_id: str, runtime_class: str, need: Sequence[int]) -> FairKey:
        """Return the key the tenant's next task (needing ``need``) is ordered by: per
        level of its path from the top, the node's share and id (the tenant last, with the
        task)."""
        book = self._book
        path = book.path(tenant_id)
        # The root lends and is lent nothing: its children are the first level compared.
        levels = []
        for cohort in reversed(path[:-1]):
            node = book.cohort_node(cohort, runtime_class)
            levels.append((_tied(node.share) if node is not None else 0.0, cohort))
        levels.append((_tied(self.share(tenant_id, runtime_class, need)), tenant_id))
        return tuple(levels)


def _tied(share: float) -> float:
    """Return ``share`` rounded so that shares equal but for float rounding tie (and go by
    node id)."""
    return round(share, 9)


def fair_order(
    tasks: Sequence[tuple[ClaimedTask, CompiledSpec]], book: QuotaBook | None,
    shares: FairShares | None,
) -> Iterator[tuple[ClaimedTask, CompiledSpec]]:
    """Yield ``tasks`` (in the policy's order) in the order the pass decides them: the
    tasks that must borrow by share (see the module doc). The caller places each task
    (and counts it in ``shares``) before asking for the next, so the book and the shares
    are those of that moment."""
    if book is None or shares is None or not book.may_borrow(
            (spec.tenant_id, spec.runtime_class, spec.total_requests) for _, spec in tasks):
        # No task can have to borrow, whatever is placed before it: the policy's order.
        yield from tasks
        return
    heads = _Heads(tasks, book, shares)
    done = [False] * len(tasks)
    pos = 0
    while pos < len(tasks):
        if done[pos]:
            pos += 1
            continue
        spec = tasks[pos][1]
        # The task at ``pos`` stays first in line until it is chosen itself.
        chosen = heads.lowest(spec.runtime_class) if heads.borrows(spec) else pos
        done[chosen] = True
        key = heads.take(chosen)
        yield tasks[chosen]
        if key is not None:
            heads.push(key)


class _Heads:
    """The first waiting task of each (tenant, managed class), and per class a heap of
    those that must borrow, by rank ``(-priority, fair key, position)``.

    An entry is current while its task is still first of its tenant's queue and its
    tenant placed nothing since (its own share moves only then); one whose tenant sits
    below a cohort is current only while nothing was placed at all (a cohort's share moves
    with any placement below it): a stale one is ranked again when it comes up.
    """

    def __init__(
        self, tasks: Sequence[tuple[ClaimedTask, CompiledSpec]], book: QuotaBook,
        shares: FairShares,
    ) -> None:
        self._tasks = tasks
        self._book = book
        self._shares = shares
        self._queues: dict[tuple[str, str], deque[int]] = {}
        self._heaps: dict[str, list[tuple]] = {}
        for pos, (_, spec) in enumerate(tasks):
            if book.managed(spec.runtime_class):
                self._queues.setdefault((spec.tenant_id, spec.runtime_class),
                                        deque()).append(pos)
        for key in self._queues:
            self.push(key)

    def borrows(self, spec: CompiledSpec) -> bool:
        """Return whether a task of ``spec`` must borrow now (False: unmanaged class)."""
        return self._book.borrows(spec.tenant_id, spec.runtime_class, spec.total_requests)

    def push(self, key: tuple[str, str]) -> None:
        """Rank the first waiting task of ``key`` when it must borrow."""
        queue = self._queues[key]
        if not queue:
            return
        pos = queue[0]
        task, spec = self._tasks[pos]
        if not self.borrows(spec):
            return  # within nominal: it keeps its turn (its own placements change that)
        shares = self._shares
        fair = shares.key(spec.tenant_id, spec.runtime_class, spec.total_requests)
        heapq.heappush(self._heaps.setdefault(key[1], []), (
            (-task.priority, fair, pos), key, shares.version_of(*key),
            shares.version if len(fair) > 1 else None))

    def lowest(self, runtime_class: str) -> int:
        """Return the position of the current entry of the lowest rank in the class."""
        heap = self._heaps[runtime_class]
        shares = self._shares
        while True:
            rank, key, own, tree = heap[0]
            queue = self._queues[key]
            if not queue or queue[0] != rank[-1] or shares.version_of(*key) != own:
                heapq.heappop(heap)  # its tenant moved on: ranked again then
            elif tree is not None and tree != shares.version:
                heapq.heappop(heap)
                self.push(key)
            else:
                return rank[-1]

    def take(self, pos: int) -> tuple[str, str] | None:
        """Take the task at ``pos`` (first of its queue) off; return its queue's key."""
        spec = self._tasks[pos][1]
        key = (spec.tenant_id, spec.runtime_class)
        queue = self._queues.get(key)
        if queue is None:
            return None
        queue.popleft()
        return key
