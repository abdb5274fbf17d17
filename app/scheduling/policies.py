"""Policies: the order in which the claimed tasks of one pass are considered.

``fifo`` keeps admission order. ``priority`` sorts by effective priority — priority plus one
point per ``aging_seconds`` of waiting — so an old low-priority task eventually overtakes new
high-priority ones. ``fair`` is dominant-resource fairness across tenants: it repeatedly
picks the tenant with the lowest dominant share (its current usage plus the tasks already
ordered in this pass, over the cluster capacity, or over its nominal quota times its fair
weight when it has a quota) and takes that tenant's oldest task. New
policies register a constructor by name with :func:`register`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from app.scheduling.records import Vector

__all__ = ["Policy", "QueuedTask", "get_policy", "register"]



class QueuedTask(NamedTuple):
    """A claimed task as a policy sees it (a named tuple: a pass builds one per claimed
    task)."""

    task_id: str
    tenant_id: str
    priority: int
    seq: int
    admitted_at: float
    requests: Vector


class Policy(Protocol):
    """Order the claimed tasks of one pass."""

    name: str

    def order(
        self,
        tasks: Sequence[QueuedTask],
        *,
        now: float,
        tenant_usage: Mapping[str, Vector],
        cluster_capacity: Vector,
    ) -> list[QueuedTask]:
        """Return ``tasks`` in the order they should be considered."""
        ...


class Fifo:
    """Admission order."""

    name = "fifo"

    def order(self, tasks, *, now, tenant_usage, cluster_capacity) -> list[QueuedTask]:
        """Return the tasks by admission sequence."""
        return sorted(tasks, key=lambda t: t.seq)


class PriorityAging:
    """Effective priority descending (priority + wait / aging_seconds), then admission."""

    name = "priority"

    def __init__(self, aging_seconds: float = 60.0) -> None:
        if aging_seconds <= 0:
            raise ValueError("aging_seconds must be positive")
        self.aging_seconds = aging_seconds

    def effective(self, task: QueuedTask, now: float) -> float:
        """Return the task's priority raised by one point per ``aging_seconds`` waited."""
        return task.priority + max(now - task.admitted_at, 0.0) / self.aging_seconds

    def order(self, tasks, *, now, tenant_usage, cluster_capacity) -> list[QueuedTask]:
        """Return the tasks by effective priority descending, then admission sequence."""
        return sorted(tasks, key=lambda t: (-self.effective(t, now), t.seq))


class DominantResourceFairness:
    """Interleave tenants by lowest dominant share, each tenant's tasks oldest first.

    ``entitlements`` gives, per tenant with a quota, what its share is measured against on
    each resource: its nominal quota times its fair weight (0 where no quota names the
    resource, which then does not count). A tenant without one is measured against the
    cluster capacity.
    """

    name = "fair"

    def __init__(self, entitlements: Mapping[str, tuple[float, float, float]] | None = None):
        self.entitlements = entitlements or {}

    def order(self, tasks, *, now, tenant_usage, cluster_capacity) -> list[QueuedTask]:
        """Return the tasks in dominant-resource-fair order."""
        cap = [max(c, 1) for c in cluster_capacity]
        queues: dict[str, list[QueuedTask]] = {}
        for t in sorted(tasks, key=lambda t: t.seq):
            queues.setdefault(t.tenant_id, []).append(t)
        usage = {t: list(tenant_usage.get(t, (0, 0, 0))) for t in queues}
        entitled = self.entitlements
        heap = [(_share(usage[t], cap, entitled.get(t)), t) for t in queues]
        heapq.heapify(heap)
        heads = dict.fromkeys(queues, 0)
        out: list[QueuedTask] = []
        while heap:
            _, tenant = heapq.heappop(heap)
            task = queues[tenant][heads[tenant]]
            heads[tenant] += 1
            out.append(task)
            for d in range(3):
                usage[tenant][d] += task.requests[d]
            if heads[tenant] < len(queues[tenant]):
                heapq.heappush(heap, (_share(usage[tenant], cap, entitled.get(tenant)),
                                      tenant))
        return out


def _share(usage: list[Any], cap: list[int], scale: tuple[float, float, float] | None
           ) -> float:
    """Return a tenant's dominant share of ``usage``: against its entitlement ``scale`` where
    it names a resource, else against the cluster's capacity ``cap``."""
    if scale is None or not any(scale):
        return max(u / c for u, c in zip(usage, cap, strict=True))
    return max(u / e for u, e in zip(usage, scale, strict=True) if e > 0)


_REGISTRY: dict[str, Callable[..., Policy]] = {
    "fifo": Fifo,
    "priority": PriorityAging,
    "fair": DominantResourceFairness,
}


def register(name: str, ctor: Callable[..., Policy]) -> None:
    """Register a policy constructor under ``name`` (replacing any previous one)."""
    _REGISTRY[name] = ctor


def get_policy(name: str, **options: object) -> Policy:
    """Return a new policy by name; ``options`` go to its constructor (e.g. aging_seconds)."""
    ctor = _REGISTRY.get(name)
    if ctor is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return ctor(**options)
