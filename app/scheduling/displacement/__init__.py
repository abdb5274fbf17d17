"""Displacement: one mechanism by which a task that fits nowhere gets capacity held for it.

Four planners share it, each a module of this package with the same shape
(:class:`Displacement`): **preempt** (lower-priority leases of the same tenant,
:mod:`.preempt`), **reclaim** (borrowed leases of the cohort, for a task within its
tenant's nominal, :mod:`.reclaim`), **fair-share reclaim** (borrowed leases of tenants
above their share, for a borrowing task whose share stays at most theirs,
:mod:`.fairshare`) and **nominate** (capacity freed on a starving task's
pools, no victims, :mod:`.nominate`). They differ only in which victims they may take and
why; everything else is here:

* :class:`Holds`, the pass's one holds object: what each task holds, the displacements
  still waiting for their victims, the grants planned, the victims taken, and which holds
  stay (``kept``) or go back (``released``);
* :meth:`Holds.grant`, the one grant builder: it takes the victims from later planners,
  assumes the holds so later tasks of the pass do not see them free, records a
  :class:`~app.scheduling.records.Displaced` of its kind, and for a preemption or a reclaim
  (a displacement that waits for victims) counts its need as its tenant's usage in the
  pass's quota book (:func:`~app.scheduling.reclaim.displaced_need`), as the next passes
  count it (a nominee's need is not counted: its quota is judged in every pass);
* :class:`Step`, what a planner is shown for each task that fits nowhere.

A planner's :meth:`~Displacement.consider` sees the task during the decision loop and
either plans at once (preempt: its hand-back replaces the pending one) or remembers it; its
:meth:`~Displacement.settle` plans what it remembered after the last decision. A new kind is
one more planner in :func:`planners`.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from app.scheduling.assumed import Assumed
from app.scheduling.explain import preempting_document, reclaiming_document
from app.scheduling.plugins.quota import QuotaBook
from app.scheduling.preemption import Victim
from app.scheduling.reclaim import displaced_need
from app.scheduling.records import (
    PREEMPTING,
    RECLAIMING,
    ClaimedTask,
    Displaced,
    Kind,
    Unclaim,
    Vector,
)
from app.scheduling.results import NoPlacement
from app.scheduling.spec import CompiledSpec

if TYPE_CHECKING:
    from app.scheduling.inputs import PassInputs

__all__ = ["Displacement", "Holds", "HoldsPlan", "Step"]


@dataclass(frozen=True, slots=True)
class Step:
    """A task that fits nowhere, as a planner sees it: its place among the pass's
    hand-backs, its spec, why it fits nowhere and what it holds already."""

    at: int
    task: ClaimedTask
    spec: CompiledSpec
    reason: NoPlacement
    held: Mapping[str, Vector] | None


@dataclass(frozen=True, slots=True)
class HoldsPlan:
    """Whose holds a committed plan gives back: placed holders, holders handed back parked
    for another reason than waiting (a new displacement takes new holds), and ``released``
    holders the pass did not claim; ``kept`` ones (nominees still nominated) keep theirs."""

    held: frozenset[uuid.UUID] = frozenset()
    waiting: frozenset[uuid.UUID] = frozenset()
    kept: frozenset[uuid.UUID] = frozenset()
    released: frozenset[uuid.UUID] = frozenset()

    def given_back(
        self, placed: Iterable[uuid.UUID], unclaims: Iterable[Unclaim],
        released: Collection[uuid.UUID] = (),
    ) -> tuple[uuid.UUID, ...]:
        """Return the tasks whose holds go back, given the plan's placements and
        hand-backs (and more ``released`` holders)."""
        if not self.held and not self.released and not released:
            return ()
        held = self.held
        out = {t for t in placed if t in held}
        out.update(u.task_id for u in unclaims if u.task_id in held and u.parked
                   and u.task_id not in self.waiting and u.task_id not in self.kept)
        out.update(self.released, released)
        return tuple(sorted(out))


class Holds:
    """The displacement state of one pass: holds, waits, grants, victims, kept, released."""

    def __init__(
        self, held: Mapping[uuid.UUID, Mapping[str, Vector]],
        waiting: Mapping[uuid.UUID, tuple[int, datetime]], *, quota: QuotaBook | None = None,
    ) -> None:
        self.held: dict[uuid.UUID, Mapping[str, Vector]] = dict(held)
        self.waiting = waiting
        #: The pass's quota book: the displacements granted count in it.
        self.quota = quota
        self.grants: dict[uuid.UUID, Displaced] = {}
        #: The pass's displacements that wait for victims, with their specs and victims, in
        #: the order granted (the reclaim book counts them).
        self.displacing: list[tuple[CompiledSpec, tuple[Victim, ...]]] = []
        #: Victims the pass's displacements took (nobody's victim twice).
        self.taken: set[str] = set()
        #: Holders that keep their holds though handed back parked, and holders whose holds
        #: go back though not claimed.
        self.kept: set[uuid.UUID] = set()
        self.released: set[uuid.UUID] = set()

    def of(self, task_id: uuid.UUID) -> Mapping[str, Vector] | None:
        """Return what ``task_id`` holds (None: it holds nothing)."""
        return self.held.get(task_id) if self.held else None

    def wait(self, task: ClaimedTask) -> Unclaim | None:
        """Return the hand-back of a task whose victims are still stopping, else None."""
        wait = self.waiting.get(task.id) if self.waiting else None
        if wait is None:
            return None
        # Looked at again while it waits (its quota changed): nothing to log.
        if task.pending_code == RECLAIMING:
            return Unclaim(task.id, RECLAIMING, reclaiming_document(*wait), parked=True,
                           event=False)
        return Unclaim(task.id, PREEMPTING, preempting_document(*wait), parked=True,
                       event=task.pending_code != PREEMPTING)

    def grant(
        self, kind: Kind, task_id: uuid.UUID, spec: CompiledSpec, *, victims: Sequence[Victim],
        holds: Sequence[tuple[str, int, Vector]], revoke_by: datetime, assumed: Assumed,
    ) -> Displaced:
        """Record a displacement for ``task_id``: its victims are taken, its holds assumed
        (later tasks of the pass see them used), its need counted in the quota book unless
        it is a nomination, and its grant kept for the commit."""
        ids = [v.task_id for v in victims]
        self.taken.update(ids)
        assumed.hold(str(task_id), [(p, a) for p, _, a in holds])
        grant = Displaced(task_id, tuple(uuid.UUID(v) for v in ids), tuple(holds),
                          revoke_by, kind)
        self.grants[task_id] = grant
        if kind is not Kind.NOMINATE:
            self.displacing.append((spec, tuple(victims)))
            if self.quota is not None:
                self.quota.add(spec.tenant_id, spec.runtime_class,
                               displaced_need(spec, victims))
        return grant

    def plan(self) -> HoldsPlan:
        """Return the holds part of the pass's plan."""
        return HoldsPlan(frozenset(self.held), frozenset(self.waiting), frozenset(self.kept),
                         frozenset(self.released))


class Displacement(Protocol):
    """A displacement planner: it sees each task that fits nowhere, then settles."""

    kind: Kind

    def consider(self, step: Step) -> Unclaim | None:
        """Look at a task that fits nowhere; return its hand-back when planned at once."""

    def settle(self, state: Settling) -> None:
        """Plan what was remembered, after the pass's last decision."""


@dataclass(slots=True)
class Settling:
    """What the planners settle on: the pass's inputs, its hand-backs (replaced in place),
    its placements so far and the holds object."""

    inputs: PassInputs
    unclaims: list[Unclaim]
    assumed: Assumed
    holds: Holds
    #: The tasks placed by the pass, and their specs.
    placed: list[tuple[ClaimedTask, CompiledSpec]]
