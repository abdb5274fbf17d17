"""Weighted fair sharing of borrowed capacity: the share of a node, and the order in which a
pass admits the tasks that must borrow.

**The share.** In a managed runtime class, a node of the quota tree (a tenant, or a cohort
above it) borrows, per resource, what it uses above its nominal. What its parent *can lend*
is the parent's lendable capacity: the sum over the parent's members of ``min(lending
limit, nominal)`` (what they would lend were they idle; a fixed figure, so a share only
moves when the node's own usage does). A node's share is its **dominant borrowed
resource**, ``max(borrowed / can lend)`` over the resources its parent can lend, divided by
its ``fairWeight`` (:func:`share_of`). A node that borrows nothing has share 0.

**The order** (:func:`fair_order`). The pass's tasks come in the policy's order. A task
whose tenant is within its nominal with the task keeps its place. Where the next task in
that order must borrow, the pass takes instead, among the first waiting task of each
tenant of the same runtime class that must borrow too, the one of the highest priority,
then of the lowest share with the task (compared level by level from the top of the
tree: :meth:`FairShares.key`), then the first in the policy's order. Shares are read
from the pass's quota book as it places work, so a pass that places many tasks divides
the borrowed capacity among tenants by weight rather than giving it to the first. With a
usage half-life set, the share a tenant is ordered by is its decayed usage's instead
(see :class:`FairShares`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

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

    __slots__ = ("_book", "_decayed", "_placed")

    def __init__(
        self, book: QuotaBook, *,
        decayed: Mapping[tuple[str, str], Sequence[float]] | None = None,
    ) -> None:
        self._book = book
        self._decayed = decayed
        #: What the pass placed per (tenant, class) (with decay: added to the decayed usage).
        self._placed: dict[tuple[str, str], list[int]] = {}

    def placed(self, tenant_id: str, runtime_class: str, need: Sequence[int]) -> None:
        """Count a placement of the pass in the decayed usage (nothing without decay)."""
        if self._decayed is None:
            return
        acc = self._placed.setdefault((tenant_id, runtime_class), [0, 0, 0])
        for i, n in enumerate(need):
            acc[i] += n

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


def _borrows(book: QuotaBook, spec: CompiledSpec) -> bool:
    return book.borrows(spec.tenant_id, spec.runtime_class, spec.total_requests)


def fair_order(
    tasks: Sequence[tuple[ClaimedTask, CompiledSpec]], book: QuotaBook | None,
    shares: FairShares | None,
) -> Iterator[tuple[ClaimedTask, CompiledSpec]]:
    """Yield ``tasks`` (in the policy's order) in the order the pass decides them: the
    tasks that must borrow by share (see the module doc). The caller places each task
    before asking for the next, so the book and the shares are those of that moment."""
    if book is None or shares is None:
        yield from tasks
        return
    # Per (tenant, class) of a managed class, its tasks' positions in order.
    queues: dict[tuple[str, str], deque[int]] = {}
    by_class: dict[str, list[tuple[str, str]]] = {}
    for pos, (_, spec) in enumerate(tasks):
        if book.managed(spec.runtime_class):
            key = (spec.tenant_id, spec.runtime_class)
            if key not in queues:
                queues[key] = deque()
                by_class.setdefault(spec.runtime_class, []).append(key)
            queues[key].append(pos)
    done = [False] * len(tasks)
    pos = 0
    while pos < len(tasks):
        if done[pos]:
            pos += 1
            continue
        spec = tasks[pos][1]
        if not book.managed(spec.runtime_class) or not _borrows(book, spec):
            chosen = pos
        else:
            # The task at ``pos`` stays first in line until it is chosen itself.
            chosen = _lowest_share(tasks, queues, by_class[spec.runtime_class], book, shares)
        done[chosen] = True
        chosen_task, chosen_spec = tasks[chosen]
        if book.managed(chosen_spec.runtime_class):
            queues[(chosen_spec.tenant_id, chosen_spec.runtime_class)].popleft()
        yield chosen_task, chosen_spec


def _lowest_share(
    tasks: Sequence[tuple[ClaimedTask, CompiledSpec]],
    queues: Mapping[tuple[str, str], deque[int]], keys: Sequence[tuple[str, str]],
    book: QuotaBook, shares: FairShares,
) -> int:
    """Return the position of the first task that must borrow, of the highest priority and
    the lowest share with it, among the first waiting task of each tenant of a class."""
    best: tuple | None = None
    for key in keys:
        queue = queues[key]
        if not queue:
            continue
        pos = queue[0]
        task, spec = tasks[pos]
        if not _borrows(book, spec):
            continue
        rank = (-task.priority, shares.key(spec.tenant_id, spec.runtime_class,
                                           spec.total_requests), pos)
        if best is None or rank < best:
            best = rank
    assert best is not None  # the task that asked is the first of its own queue
    return best[-1]
