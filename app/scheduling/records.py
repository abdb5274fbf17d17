"""The plain records a pass reads and plans: claimed tasks, hand-backs, grants, holds.

They are the hand-offs between the phases of a pass (:mod:`app.scheduling.planner`): the
reconciler's read fills them from the ledger, the planner builds new ones, and the ledger
writes them. Plain, typed and immutable; no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

__all__ = [
    "NOMINATED",
    "PREEMPTING",
    "RECLAIMING",
    "ClaimedTask",
    "Displaced",
    "Grant",
    "Kind",
    "LiveLease",
    "Nomination",
    "Unclaim",
    "Vector",
    "vector_sum",
]

#: An amount of every resource: (cpu millis, memory MiB, llm slots).
Vector = tuple[int, int, int]

#: Pending code (and event reason) of a preemptor waiting for its victims to stop.
PREEMPTING = "preempting"
#: Pending code of a task waiting for the borrowed leases it reclaims to stop.
RECLAIMING = "reclaiming"
#: Pending code (and event reason) of a nominated task.
NOMINATED = "nominated"


def vector_sum(vectors: Iterable[Vector]) -> Vector:
    """Return the element-wise sum of resource vectors."""
    cpu = memory = llm = 0
    for v in vectors:
        cpu += v[0]
        memory += v[1]
        llm += v[2]
    return (cpu, memory, llm)


class Kind(StrEnum):
    """What displaces: a preemption (same tenant, lower priority), a reclaim (borrowed work
    of the cohort), a fair-share reclaim (borrowed work of tenants above their share) or a
    nomination (capacity freed on a starving task's pools)."""

    PREEMPT = "preempt"
    RECLAIM = "reclaim"
    FAIR_SHARE = "fair_share"
    NOMINATE = "nominate"


class ClaimedTask(NamedTuple):
    """A task claimed (row-locked) by this pass, with what scheduling it needs.

    A named tuple: a pass builds one per claimed row, straight from the claim's columns.
    """

    id: uuid.UUID
    tenant_id: str
    seq: int
    priority: int
    #: The stored spec as JSON text (equal texts compile to equal specs: a cache key).
    spec_json: str
    admitted_at: datetime
    attempts: int
    #: The stored pending code, when the task was looked at before (a re-examination of a
    #: woken task: parked again for the same code, it writes no event).
    pending_code: str | None = None
    #: The stored pending reason (JSON text) and stage, restored if a lease is undone.
    pending_json: str | None = None
    pending_stage: int | None = None
    #: The pending code the task's event log last recorded, and when (None: none since the
    #: column exists): a reason change within a park sweep period of it is not logged yet.
    logged_code: str | None = None
    logged_at: datetime | None = None
    #: Pending-reason events the task logged (its log is trimmed past the kept count).
    logged_count: int = 0

    @property
    def spec(self) -> dict[str, Any]:
        """Return the stored spec as a dict."""
        return orjson.loads(self.spec_json)


class LiveLease(NamedTuple):
    """A live lease as an estimate lets it end: its pool, its task's tenant and runtime
    class, what it reserves on the pool, and when it was granted."""

    pool_id: str
    tenant_id: str
    runtime_class: str
    amount: Vector
    granted_at: datetime


class Grant(NamedTuple):
    """A decided placement to apply: the task, its stored placement and its members."""

    task_id: uuid.UUID
    #: The placement as stored (JSON text, :mod:`app.scheduling.explain`'s format).
    placement: str
    #: (pool id, member count, runtime instance id) per pool the task uses.
    members: tuple[tuple[str, int, str], ...]
    #: What one member requests: (cpu, memory, llm).
    requests: tuple[int, int, int]
    #: Wake keys this placement carries once leased (``placed:<tenant>`` for a labelled
    #: task: parked tasks of its tenant waiting for an affinity match).
    wakes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unclaim:
    """A claimed task handed back to the queue: parked with a pending reason, or not.

    ``event`` False hands it back without an event (a re-examination that found the same
    reason, or a changed one logged too recently: the row still gets the new reason). A
    hand-back that neither parks nor carries a pending reason (a lost race) leaves the row
    as it is: only its event is written.
    """

    task_id: uuid.UUID
    reason: str
    pending_reason: Mapping[str, Any] | None = None
    parked: bool = False
    #: Wake keys of a parked task (None: woken only by the safety sweep).
    wake: tuple[str, ...] | None = None
    #: Stage of the pending reason's closest miss (with ``pending_reason``).
    stage: int | None = None
    event: bool = True
    #: Events kept besides the first when the event must trim the task's log (None: no trim).
    trim_to: int | None = None

    @property
    def changes_row(self) -> bool:
        """Return whether the hand-back writes the task row (not only an event)."""
        return self.parked or self.pending_reason is not None

    @property
    def logged_code(self) -> str | None:
        """Return the pending code this hand-back's event records (None: no such event)."""
        return self.reason if self.event and self.pending_reason is not None else None


@dataclass(frozen=True, slots=True)
class Displaced:
    """A planned displacement to apply: the task it is for, its victims and its holds."""

    task_id: uuid.UUID
    victims: tuple[uuid.UUID, ...]
    #: (pool id, members, amount) per pool of the task's members: the free capacity held
    #: for it at once (what its victims there will not free).
    holds: tuple[tuple[str, int, Vector], ...]
    revoke_by: datetime
    kind: Kind = Kind.PREEMPT

    def amounts(self) -> dict[str, Vector]:
        """Return what the holds add to each pool's ledger."""
        out: dict[str, Vector] = {}
        for p, _, a in self.holds:
            b = out.get(p, (0, 0, 0))
            out[p] = (a[0] + b[0], a[1] + b[1], a[2] + b[2])
        return out


@dataclass(frozen=True, slots=True)
class Nomination:
    """One nominated pool: the nominee, its rank, its members there and their need."""

    pool_id: str
    task_id: uuid.UUID
    runtime_class: str
    members: int
    need: Vector
    created_at: datetime
    priority: int
    seq: int
    #: The nominee's state (a nomination of a task no longer admitted awaits recovery).
    state: str
