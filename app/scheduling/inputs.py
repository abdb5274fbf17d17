"""What a pass's planner reads: one immutable :class:`PassInputs`, and nothing else.

The reconciler's read phase fills it from the ledger (:mod:`app.reconciler.reading`); the
previews fill it for their own question (a placement, a drain). Everything the planner
(:func:`app.scheduling.planner.plan_pass`) decides from is here: the snapshot, the claimed
tasks in claim order, the quota book's rows, the holds and the displacements under way,
the nominations, the plugin profile and the settings that decide, and the pass clock
``now``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from app.scheduling.plugins.quota import CohortRow, QuotaRow
from app.scheduling.plugins.registry import Profile
from app.scheduling.preemption import Victim
from app.scheduling.records import ClaimedTask, Nomination, Vector
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

__all__ = [
    "NominationInputs",
    "PassInputs",
    "PassSettings",
    "QueueHead",
    "ReclaimInputs",
]

#: A waiting task as the nominations rank it: (id, priority, seq).
QueueHead = tuple[uuid.UUID, int, int]


@dataclass(frozen=True, slots=True)
class PassSettings:
    """The settings that decide a pass (the reconciler's configuration, in part)."""

    #: Ranked candidates kept per decision.
    top_k: int
    #: Order of the tasks: fifo, priority or fair.
    policy: str
    priority_aging_seconds: float
    #: A re-examined task logs at most one change of its pending reason per this period.
    park_sweep_seconds: float
    #: Pending-reason events a task keeps besides its first.
    task_events_kept: int
    #: How long a displacement's victims may take to stop.
    preemption_grace_seconds: float
    #: A lease younger than this is never a reclaim's victim.
    reclaim_min_runtime_seconds: float
    #: A first-of-its-class task that has not fit for this long is nominated (0: never).
    nomination_seconds: float
    #: Half-life of the decayed usage tenants that borrow are ordered by (0: off, they are
    #: ordered by their share now).
    fair_usage_half_life_seconds: float = 0.0
    #: Explain every decision (every candidate and rejection, every preemption candidate):
    #: a preview's plan.
    explain: bool = False
    #: With ``explain``: the best this many candidates carry their score components (None:
    #: every candidate; a preview's page needs only its own).
    explain_components: int | None = None


@dataclass(frozen=True, slots=True)
class ReclaimInputs:
    """What reclaim plans from: the waiting preemptors and reclaimers, what revocations give
    back, and the leases of borrowing tenants it could take."""

    #: Preemptors and reclaimers still waiting; their needs are counted in the quota rows
    #: already.
    waiting: frozenset[uuid.UUID] = frozenset()
    #: Per (tenant, runtime class), what leases being revoked give back beyond what the quota
    #: rows gave back already (:func:`~app.scheduling.reclaim.displacers_counted`).
    revoking: Mapping[tuple[str, str], Vector] = field(default_factory=dict)
    #: Leases of borrowing tenants, old enough to be taken.
    victims: tuple[Victim, ...] = ()
    #: Leased before this (seconds since the epoch) to be a victim.
    leased_before: float = 0.0


@dataclass(frozen=True, slots=True)
class NominationInputs:
    """What nomination plans from: the nominations, the head of each runtime class's queue,
    and for each possible nominee what lower-ranked work reserves on its pools."""

    nominations: tuple[Nomination, ...] = ()
    #: Per runtime class, its first competing tasks in rank order (enough of them that the
    #: first one a pass does not place is always among them).
    heads: Mapping[str, tuple[QueueHead, ...]] = field(default_factory=dict)
    #: Per possible nominee, what lower-ranked leases reserve on each pool of its class.
    lower: Mapping[uuid.UUID, Mapping[str, Vector]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PassInputs:
    """Everything one pass plans from, read once."""

    now: datetime
    settings: PassSettings
    #: The plugins that decide.
    profile: Profile
    snapshot: Snapshot
    #: The claimed tasks whose specs compiled, with their specs, in claim order.
    tasks: tuple[tuple[ClaimedTask, CompiledSpec], ...]
    #: The claimed tasks whose stored specs cannot be read, with why.
    invalid: tuple[tuple[ClaimedTask, str], ...] = ()
    #: Tenants' usage (the ``fair`` policy) and entitlements (``fair`` with quotas).
    usage: Mapping[str, Vector] = field(default_factory=dict)
    entitlements: Mapping[str, tuple[float, float, float]] | None = None
    #: Quota rows of the tasks' runtime classes (waiting displacers' needs counted as usage)
    #: and the tenants' cohorts; empty: no class is managed.
    quota_rows: tuple[QuotaRow, ...] = ()
    cohorts: Mapping[str, str] = field(default_factory=dict)
    #: The cohorts' rows of those classes (the quota tree) and the tenants' fair weights.
    quota_cohorts: tuple[CohortRow, ...] = ()
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    #: With a usage half-life: per (tenant, class), its decayed usage per resource.
    fair_usage: Mapping[tuple[str, str], tuple[float, float, float]] | None = None
    #: Capacity held per task and pool (free for that task only).
    holds: Mapping[uuid.UUID, Mapping[str, Vector]] = field(default_factory=dict)
    #: Tasks whose victims are still stopping: (victims, revoke by).
    waiting: Mapping[uuid.UUID, tuple[int, datetime]] = field(default_factory=dict)
    #: Leased tasks the claimed preemptors' tenants may displace.
    victims: tuple[Victim, ...] = ()
    reclaim: ReclaimInputs | None = None
    nomination: NominationInputs | None = None
