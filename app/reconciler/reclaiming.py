"""A pass's reclaims: tasks within their tenant's nominal take back borrowed capacity.

A pass with quota rows first reads the reclaimers still waiting (:meth:`PassReclaim.load`:
they hold capacity, so the read is of a few indexed rows). Their needs count as their
tenants' usage in the pass's quota rows (:meth:`PassReclaim.quota_rows`): the nominal being
reclaimed is not lent to anyone else meanwhile, so a victim requeued next to its reclaimer
waits for quota (``quota_borrow_unavailable``), not for capacity. A claimed reclaimer, whose
need is counted already, is decided without a second quota check (:meth:`counted`).

While the pass decides its tasks, a task of a managed runtime class that fits its quota but
finds no pool for capacity (and planned no same-tenant preemption) is remembered
(:meth:`PassReclaim.consider`); nothing is read for it yet. After the last decision, when
some were remembered, :meth:`PassReclaim.plan` reads what the cohorts' tenants use, give back
and wait for (:mod:`app.ledger.reclaim`), then asks the pure core
(:func:`~app.scheduling.reclaim.plan_reclaim`) for each, in the pass's order, on top of every
placement and hold of the pass. A reclaim is carried by the pass's preemption state
(:class:`~app.reconciler.preempting.PassPreemption`) like a preemption: its victims' leases
go ``REVOKING`` at commit, the free part of its need is held at once, and the task is handed
back parked with the pending code ``reclaiming``; a reclaim whose victims changed meanwhile is
lost like a preemption and the task goes back to the queue.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from app.db import Connection
from app.ledger.claims import ClaimedTask, Unclaim
from app.ledger.preemption import PreemptionGrant
from app.ledger.reclaim import (
    RECLAIMING,
    reclaim_revoking_read,
    reclaim_victims_read,
    reclaimers_read,
)
from app.scheduling.assumed import Assumed
from app.scheduling.framework import feasible_but_capacity
from app.scheduling.plugins.quota import RESOURCES, QuotaRow
from app.scheduling.preemption import waiting_document
from app.scheduling.reasons import Reason
from app.scheduling.reclaim import ReclaimBook, ReclaimIndex, book_reclaimed, plan_reclaim
from app.scheduling.results import NoPlacement
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import CompiledSpec

__all__ = ["PassReclaim", "reclaiming_document"]

#: Headlines a reclaim can help: the pools that pass every other filter lack capacity (for
#: a gang, also: some pools fit a member but no plan fits them all).
_CAPACITY = frozenset({Reason.INSUFFICIENT_CPU, Reason.INSUFFICIENT_MEMORY,
                       Reason.INSUFFICIENT_LLM_SLOTS})
_GANG = _CAPACITY | {Reason.GANG_UNSATISFIABLE}


def reclaiming_document(
    victims: int, revoke_by: datetime, *, rejections: Mapping[str, int] | None = None,
    victim_ids: Iterable[str] = (), pool_ids: Iterable[str] = (),
) -> dict[str, Any]:
    """Build the pending reason of a task waiting for ``victims`` borrowed leases."""
    noun = "lease" if victims == 1 else "leases"
    return waiting_document(
        RECLAIMING, f"reclaiming its tenant's nominal: waiting for {victims} borrowed {noun} "
        "of its cohort to stop", victims, revoke_by, rejections=rejections,
        victim_ids=victim_ids, pool_ids=pool_ids)


class PassReclaim:
    """The reclaims of one pass (free when no task of the pass could reclaim)."""

    def __init__(
        self, *, rows: list[QuotaRow], cohorts: Mapping[str, str], grace_seconds: float,
        min_runtime_seconds: float,
    ) -> None:
        self._rows = rows
        self._cohorts = cohorts
        self._managed = {r.runtime_class for r in rows}
        self._waits: dict[uuid.UUID, tuple[str, str, tuple[int, int, int]]] = {}
        self.grace_seconds = grace_seconds
        self.min_runtime_seconds = min_runtime_seconds
        #: (index in the pass's hand-backs, task, spec, reason, holds) of each candidate.
        self._candidates: list[tuple[int, ClaimedTask, CompiledSpec, NoPlacement, Any]] = []
        #: The reclaiming tasks planned (their grants are the preemption state's).
        self.planned: set[uuid.UUID] = set()
        self.outcomes: Counter[str] = Counter()

    async def load(self, conn: Connection) -> None:
        """Read the reclaimers still waiting; count their needs in the quota rows."""
        self._waits = await reclaimers_read(conn)
        if not self._waits:
            return
        more: dict[tuple[str, str, str], int] = {}
        for tenant, rc, need in self._waits.values():
            for resource, amount in zip(RESOURCES, need, strict=True):
                key = (tenant, rc, resource)
                more[key] = more.get(key, 0) + amount
        self._rows = [
            dataclasses.replace(r, used=r.used + more[k])
            if (k := (r.tenant_id, r.runtime_class, r.resource)) in more else r
            for r in self._rows
        ]

    def quota_rows(self) -> list[QuotaRow]:
        """Return the quota rows with the waiting reclaimers' needs counted as usage."""
        return self._rows

    def counted(self, task_id: uuid.UUID) -> bool:
        """Return whether ``task_id`` is a waiting reclaimer whose need the rows count."""
        return task_id in self._waits

    def consider(
        self, at: int, task: ClaimedTask, spec: CompiledSpec, reason: NoPlacement,
        held: Any,
    ) -> None:
        """Remember a task that fits nowhere, whose hand-back is the pass's ``at``-th."""
        if (reason.code in (_GANG if spec.is_gang else _CAPACITY)
                and spec.runtime_class in self._managed and task.id not in self._waits):
            self._candidates.append((at, task, spec, reason, held))

    async def plan(
        self,
        conn: Connection,
        unclaims: list[Unclaim],
        *,
        snapshot: Snapshot,
        assumed: Assumed,
        placed: Iterable[CompiledSpec],
        grants: dict[uuid.UUID, PreemptionGrant],
        taken: set[str],
        now: datetime,
    ) -> None:
        """Plan the candidates' reclaims, replacing their hand-backs and adding their grants
        to ``grants`` (``placed``: the specs the pass placed, but counted reclaimers;
        ``taken``: the victims the pass's preemptions took, grown by the reclaims')."""
        if not self._candidates:
            return
        classes = {spec.runtime_class for _, _, spec, _, _ in self._candidates}
        revoking = await reclaim_revoking_read(conn, runtime_classes=classes)
        book = ReclaimBook(self._rows, self._cohorts, revoking=revoking)
        for spec in placed:
            book.add(spec.tenant_id, spec.runtime_class,
                     np.array(spec.total_requests, dtype=np.int64))
        # Only tasks within their nominal reclaim, only from borrowers of their cohorts, and
        # only on the pools they could take: the victims read is bounded by all three.
        within = [c for c in self._candidates if book.within_nominal(
            c[2].tenant_id, c[2].runtime_class, c[2].total_requests)]
        cohorts = {book.cohort(c[2].tenant_id) for c in within}
        lenders = {r.tenant_id for r in self._rows if r.runtime_class in classes
                   and book.cohort(r.tenant_id) in cohorts
                   and book.borrowed(r.tenant_id, r.runtime_class).any()}
        self.outcomes["unavailable"] += len(self._candidates) - len(within)
        if not lenders:
            self.outcomes["unavailable"] += len(within)
            return
        ids = snapshot.ids
        pools = {ids[i] for _, _, spec, _, held in within for i in feasible_but_capacity(
            spec, snapshot, assumed=assumed, holds=held)[0].tolist()}
        cutoff = now - timedelta(seconds=self.min_runtime_seconds)
        victims = await reclaim_victims_read(
            conn, tenant_ids=lenders, pool_ids=pools, leased_before=cutoff)
        index = ReclaimIndex(snapshot, victims)
        revoke_by = now + timedelta(seconds=self.grace_seconds)
        for at, task, spec, reason, held in within:
            planned = plan_reclaim(
                spec, snapshot, index, book, assumed=assumed, taken=taken, holds=held,
                leased_before=cutoff.timestamp(),
            )
            if planned is None:
                self.outcomes["unavailable"] += 1
                continue
            book_reclaimed(book, spec, planned)
            victim_ids = tuple(v.task_id for v in planned.victims)
            taken.update(victim_ids)
            assumed.hold(spec.task_id or str(task.id), [(p, a) for p, _, a in planned.holds])
            grants[task.id] = PreemptionGrant(
                task.id, tuple(uuid.UUID(v) for v in victim_ids), planned.holds, revoke_by)
            self.planned.add(task.id)
            doc = reclaiming_document(
                len(victim_ids), revoke_by, rejections=reason.rejections, victim_ids=victim_ids,
                pool_ids=[p for p, _ in planned.members])
            unclaims[at] = Unclaim(task.id, RECLAIMING, doc, parked=True)
