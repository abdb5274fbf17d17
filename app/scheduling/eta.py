"""When a waiting task will start, asked of the pass's planner. Pure (no I/O).

An estimate is a question a pass answers: its inputs
(:class:`~app.scheduling.inputs.PassInputs`) hold the task and the tasks ahead of it in the
pass's order, and :func:`~app.scheduling.planner.plan_pass` plans them as a pass would, the
tasks ahead placed first. When the planner places the task now, it starts at the next pass.
Otherwise :func:`forecast` lets live leases end one at a time, in the order given (the oldest
first): each gives back what it reserves on its pool and what it counts in its tenant's quota
usage (and up the quota tree), and the planner plans again on the same inputs, until it
places the task. The answer is how many leases had to end, and where the task goes; past the
leases given (a bounded list), there is none.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.scheduling.inputs import PassInputs
from app.scheduling.planner import Placed, ordered_tasks, plan_outcomes
from app.scheduling.plugins.quota import RESOURCES, QuotaRow, cohort_rows_drawn
from app.scheduling.records import ClaimedTask, LiveLease, Vector
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

__all__ = ["Forecast", "candidate_pools", "forecast", "tasks_until"]


@dataclass(frozen=True, slots=True)
class Forecast:
    """What the planner says of a waiting task as leases end."""

    #: Leases that had to end before the planner places it (0: it is placed now); None: it
    #: is not placed even once every lease given has ended.
    ended: int | None
    #: The pool of its placement (its first member's), when placed.
    pool_id: str | None = None
    #: Tasks the planner placed ahead of it in that plan.
    placed_ahead: int = 0
    #: With no placement: the planner's pending reason after the last lease ended.
    reason: Mapping[str, Any] | None = None


def tasks_until(
    inputs: PassInputs, task_id: uuid.UUID
) -> tuple[tuple[ClaimedTask, CompiledSpec], ...]:
    """Return the inputs' tasks in the policy's order up to ``task_id`` (included): the
    tasks after it cannot change where it goes (the plan itself interleaves them by fair
    share, as a pass does)."""
    out = []
    for task, spec in ordered_tasks(inputs):
        out.append((task, spec))
        if task.id == task_id:
            break
    return tuple(out)


def candidate_pools(snapshot: Snapshot, spec: CompiledSpec) -> list[str]:
    """Return the pools of the spec's runtime class open to its tenant whose totals can hold
    one of its members: the pools where capacity freed can help it."""
    code = snapshot.rc_table.get(spec.runtime_class)
    seen = snapshot.by_tenant.get(spec.tenant_id)
    if code is None or seen is None:
        return []
    fits = (snapshot.rc[seen] == code) & (snapshot.cap[seen] >= np.array(spec.requests)).all(
        axis=1) & snapshot.has_ledger[seen]
    return [snapshot.ids[i] for i in seen[fits].tolist()]


class _Room:
    """Whether the task could fit on some pool at all: a pool of its class open to its
    tenant whose totals, less what is reserved there, plus every hold of the inputs there
    (a holder placed elsewhere gives its holds back), hold one member. The capacity filter
    rejects every pool otherwise, so the planner cannot place it and need not be asked."""

    def __init__(self, inputs: PassInputs, task_id: uuid.UUID) -> None:
        snapshot = inputs.snapshot
        spec = next((s for t, s in inputs.tasks if t.id == task_id), None)
        seen = None if spec is None else snapshot.by_tenant.get(spec.tenant_id)
        code = None if spec is None else snapshot.rc_table.get(spec.runtime_class)
        if spec is None or seen is None or code is None:
            self.idx = np.empty(0, dtype=np.intp)
        else:
            self.idx = seen[(snapshot.rc[seen] == code) & snapshot.has_ledger[seen]]
        self.cap = snapshot.cap[self.idx]
        self.request = np.array(spec.requests if spec is not None else (0, 0, 0))
        rows = {int(p): r for r, p in enumerate(self.idx.tolist())}
        self.held = np.zeros_like(self.cap)
        for holds in inputs.holds.values():
            for pool_id, amount in holds.items():
                r = rows.get(snapshot.pos.get(pool_id, -1))
                if r is not None:
                    self.held[r] += np.array(amount)

    def possible(self, reserved: np.ndarray) -> bool:
        """Return whether one member could fit somewhere with ``reserved``."""
        free = self.cap - reserved[self.idx] + self.held
        return bool((free >= self.request).all(axis=1).any())


def _rows_freed(
    rows: Sequence[QuotaRow], freed: Mapping[tuple[str, str], Vector]
) -> tuple[QuotaRow, ...]:
    """Return the quota ``rows`` with what ended leases used given back."""
    out = []
    for r in rows:
        back = freed.get((r.tenant_id, r.runtime_class))
        if back is not None:
            r = dataclasses.replace(r, used=max(0, r.used - back[RESOURCES.index(r.resource)]))
        out.append(r)
    return tuple(out)


def forecast(
    inputs: PassInputs, task_id: uuid.UUID, leases: Sequence[LiveLease],
    *, first: Forecast | None = None,
) -> Forecast:
    """Return when the planner places ``task_id`` as ``leases`` end one at a time, in their
    order (see the module doc); ``first`` is the forecast of ``inputs`` themselves, when it
    was made already."""
    now = first or _placed(inputs, task_id, 0)
    if now.ended is not None or not leases:
        return now
    snapshot = inputs.snapshot
    reserved = snapshot.reserved.copy()
    freed: dict[tuple[str, str], Vector] = {}
    rows, tree = inputs.quota_rows, inputs.quota_cohorts
    room = _Room(inputs, task_id)
    last = now
    for ended, lease in enumerate(leases, 1):
        i = snapshot.pos.get(lease.pool_id)
        if i is not None:
            reserved[i] = np.maximum(reserved[i] - np.array(lease.amount), 0)
        key = (lease.tenant_id, lease.runtime_class)
        was = freed.get(key, (0, 0, 0))
        freed[key] = (was[0] + lease.amount[0], was[1] + lease.amount[1],
                      was[2] + lease.amount[2])
        if not room.possible(reserved):
            continue
        after = _rows_freed(rows, freed) if rows else rows
        step = dataclasses.replace(
            inputs, snapshot=snapshot.with_reserved(reserved.copy()), quota_rows=after,
            quota_cohorts=tuple(cohort_rows_drawn(tree, rows, after)) if tree else tree,
        )
        last = _placed(step, task_id, ended)
        if last.ended is not None:
            return last
    return last


def _placed(inputs: PassInputs, task_id: uuid.UUID, ended: int) -> Forecast:
    """Return the forecast of ``task_id`` from one plan of ``inputs``, ``ended`` leases on;
    the tasks placed ahead of it are counted only on pools its tenant can use (no tenant
    learns of the work of tenants it shares no pool with)."""
    outcomes = plan_outcomes(inputs)
    out = outcomes[task_id]
    if not isinstance(out, Placed):
        return Forecast(None, reason=out.pending_reason)
    snapshot = inputs.snapshot
    seen = snapshot.by_tenant.get(out.task.tenant_id)
    usable = set() if seen is None else {snapshot.ids[i] for i in seen.tolist()}
    ahead = sum(1 for o in outcomes.values() if isinstance(o, Placed) and o is not out
                and any(pool in usable for pool, _ in o.members))
    return Forecast(ended, out.members[0][0], ahead)
