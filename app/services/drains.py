"""Drain preview: where a pool's work would go if its leases were revoked now; writes nothing.

When a drain's deadline passes, every live lease on the pool is revoked: each task gives back
all its leases and reservations (a gang's members on other pools too) and is admitted again
(or fails, if that was its last attempt). The preview answers, for each live lease, what the
next pass would do with its task, by the pass's own means: the pool rows as a pass reads them
(:func:`app.ledger.snapshot.pools_read`), with the drained pool DRAINING and the capacity the
moving tasks hold elsewhere given back, then the moving tasks in the configured policy's order
(:func:`app.reconciler.passes.queue_order`), each decided by the one pipeline
(:func:`app.scheduling.framework.decide`) with the earlier ones' placements counted as assumed
usage, as a pass counts them. Quotas too: the tenants' quota rows of the moving tasks' runtime
classes, less the usage the revoked leases give back, are the pass's quota stage
(:class:`~app.scheduling.plugins.quota.QuotaBook`), and each predicted placement is counted in
it, so a task its tenant's quota would refuse waits with ``quota_exceeded`` or
``quota_borrow_unavailable``. Nothing is reserved and nothing is written: a drain started
right after may still see the ledger move.

The read (:func:`drain_inputs_read`, on the event loop) and the decision
(:func:`drain_decide`, pure, run in a worker by the API) are separate steps.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from pydantic import ValidationError

from app.auth import Principal
from app.db import Database
from app.ledger.drains import (
    LeaseMoving,
    drain_leases_decode,
    drain_leases_packed_read,
    drain_released_read,
    drain_usage_returned_read,
)
from app.ledger.quotas import RESOURCES, QuotaRow, quota_rows_read
from app.ledger.snapshot import placements_read, pools_read, tenant_usage_read
from app.ledger.tenants import tenants_entitlements
from app.reconciler.config import ReconcilerConfig
from app.reconciler.passes import INVALID_SPEC, SCHEDULER_ERROR, queue_order, queued_task
from app.scheduling.assumed import Assumed
from app.scheduling.explain import no_placement_document
from app.scheduling.framework import decide
from app.scheduling.plugins.quota import QuotaBook
from app.scheduling.reasons import Reason
from app.scheduling.results import NoPlacement
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import CompiledSpec, StoredSpecs
from app.services.pools import pool_operated, pool_viewer

__all__ = ["ATTEMPTS_EXHAUSTED", "DrainInputs", "DrainMove", "drain_decide", "drain_inputs_read"]

log = logging.getLogger("berth.api.pools")

#: Reason code of a task whose revoked lease would fail it: it has no attempt left.
ATTEMPTS_EXHAUSTED = "attempts_exhausted"


@dataclass(frozen=True, slots=True)
class DrainMove:
    """What revoking one live lease now would do: the task's new pools, or why it would wait.

    ``members`` is every member's (pool, count), the first member's pool first; empty with a
    ``reason`` ``{"code", "message", "rejections"}`` when the task would not be placed now.
    """

    lease_id: uuid.UUID
    task_id: uuid.UUID
    tenant_id: str
    members: tuple[tuple[str, int], ...]
    reason: dict[str, object] | None


def _without(
    pools: list[PoolState], *, pool_id: str, released: dict[str, tuple[int, int, int]]
) -> list[PoolState]:
    """Return ``pools`` as a pass would see them once ``pool_id`` drains and its leases'
    tasks gave back what they hold on other pools."""
    out = []
    for p in pools:
        if p.id == pool_id:
            p = replace(p, status="DRAINING")
        elif p.id in released:
            r, give = p.reserved, released[p.id]
            p = replace(p, reserved=(r[0] - give[0], r[1] - give[1], r[2] - give[2]))
        out.append(p)
    return out


def _reason(code: str, message: str) -> dict[str, object]:
    return {"code": code, "message": message, "rejections": {}}


@dataclass(frozen=True, slots=True)
class DrainInputs:
    """What a drain preview decides on: the moving leases and the world as a pass would see
    it once they are revoked (the drained pool DRAINING, their capacity given back)."""

    #: The live leases of the pool, as :func:`~app.ledger.drains.drain_leases_packed_read`
    #: gives them.
    leases: str
    pools: list[PoolState]
    placed: list[PlacedTask]
    config: ReconcilerConfig
    usage: dict[str, tuple[int, int, int]]
    now: datetime
    quota_rows: list[QuotaRow]
    cohorts: dict[str, str]
    entitlements: Mapping[str, tuple[float, float, float]] | None


async def drain_inputs_read(
    db: Database,
    *,
    principal: Principal,
    pool_id: str,
    config: ReconcilerConfig,
    now: datetime,
) -> DrainInputs:
    """Read what revoking every live lease of ``pool_id`` now depends on; decides nothing.
    404 when the caller cannot see the pool, 403 when it may not operate it."""
    viewer = pool_viewer(principal)
    async with db.connection() as conn:
        await pool_operated(conn, viewer=viewer, pool_id=pool_id, action="preview a drain of")
        # The leases come as one text, decoded by the worker that decides.
        leases, tenants = await drain_leases_packed_read(conn, pool_id=pool_id)
        if not tenants:
            return DrainInputs("[]", [], [], config, {}, now, [], {}, None)
        released = await drain_released_read(conn, pool_id=pool_id)
        pools = await pools_read(
            conn, now=now, freshness_seconds=config.heartbeat_freshness_seconds
        )
        # The moving tasks have left their pools: affinity no longer counts them there.
        placed = await placements_read(conn, tenant_ids=tenants, leaving=pool_id)
        usage = await tenant_usage_read(conn, tenant_ids=tenants) if config.policy == "fair" else {}
        returned = await drain_usage_returned_read(conn, pool_id=pool_id)
        rows, cohorts = await quota_rows_read(
            conn, runtime_classes={rc for _, rc in returned}, tenant_ids=tenants
        )
        entitlements = (
            await tenants_entitlements(conn, tenant_ids=tenants)
            if config.policy == "fair" and rows else None
        )
    return DrainInputs(
        leases, _without(pools, pool_id=pool_id, released=released), placed,
        config, usage, now, _returned(rows, returned), cohorts, entitlements,
    )


def drain_decide(inputs: DrainInputs) -> list[DrainMove]:
    """Return, for each moving lease, where its task would be placed (or why it would
    wait), in the leases' order; pure."""
    leases = drain_leases_decode(inputs.leases)
    if not leases:
        return []
    snapshot = Snapshot.build(inputs.pools, inputs.placed, strategy=inputs.config.strategy)
    book = QuotaBook(inputs.quota_rows, inputs.cohorts) if inputs.quota_rows else None
    return _decide_all(leases, snapshot, config=inputs.config, usage=inputs.usage,
                       now=inputs.now, quotas=book, entitlements=inputs.entitlements)


def _returned(
    rows: list[QuotaRow], returned: dict[tuple[str, str], tuple[int, int, int]]
) -> list[QuotaRow]:
    """Return the quota ``rows`` with what the revoked leases use given back."""
    out = []
    for r in rows:
        back = returned.get((r.tenant_id, r.runtime_class))
        if back is not None:
            r = replace(r, used=r.used - back[RESOURCES.index(r.resource)])
        out.append(r)
    return out


def _decide_all(
    leases: list[LeaseMoving],
    snapshot: Snapshot,
    *,
    config: ReconcilerConfig,
    usage: dict[str, tuple[int, int, int]],
    now: datetime,
    quotas: QuotaBook | None = None,
    entitlements: Mapping[str, tuple[float, float, float]] | None = None,
) -> list[DrainMove]:
    """Decide the moving tasks in policy order, each seeing the ones before it as assumed
    usage (and quota usage, in ``quotas``); return one move per lease, in the leases'
    order."""
    specs = StoredSpecs(len(leases))
    decided: dict[uuid.UUID, DrainMove] = {}
    compiled: dict[str, tuple[LeaseMoving, CompiledSpec]] = {}
    for lease in leases:
        if lease.attempts + 1 >= lease.max_attempts:
            decided[lease.lease_id] = DrainMove(
                lease.lease_id, lease.task_id, lease.tenant_id, (), _reason(
                    ATTEMPTS_EXHAUSTED,
                    "revoking its lease would fail the task: it is on its last attempt "
                    f"({lease.attempts + 1} of {lease.max_attempts})",
                ),
            )
            continue
        try:
            compiled[str(lease.lease_id)] = (lease, specs.compile(lease.tenant_id, lease.spec_json))
        except (ValidationError, ValueError, TypeError) as exc:
            decided[lease.lease_id] = DrainMove(
                lease.lease_id, lease.task_id, lease.tenant_id, (), _reason(
                    INVALID_SPEC,
                    f"stored spec cannot be read: {str(exc).splitlines()[0][:200]}",
                ),
            )

    ordered = queue_order(
        config,
        [queued_task(key, lease.tenant_id, lease.priority, lease.seq, lease.admitted_at, spec)
         for key, (lease, spec) in compiled.items()],
        snapshot=snapshot, usage=usage, now=now, entitlements=entitlements,
    )
    assumed = Assumed(snapshot)
    for q in ordered:
        lease, spec = compiled[q.task_id]
        try:
            outcome = decide(spec, snapshot, assumed=assumed, top_k=config.top_k, quotas=quotas)
        except Exception as exc:
            log.exception("drain preview: select failed for a task",
                          extra={"task_id": str(lease.task_id)})
            decided[lease.lease_id] = DrainMove(
                lease.lease_id, lease.task_id, lease.tenant_id, (), _reason(
                    SCHEDULER_ERROR, f"the scheduler failed on this task: {type(exc).__name__}"
                ),
            )
            continue
        members = outcome.members
        if members is not None:
            assumed.add(spec, members, task_id=str(lease.task_id))
            if quotas is not None:
                quotas.add(spec.tenant_id, spec.runtime_class, spec.total_requests)
            decided[lease.lease_id] = DrainMove(
                lease.lease_id, lease.task_id, lease.tenant_id, tuple(members), None
            )
            continue
        reason = outcome.reason or NoPlacement(Reason.TENANT_NOT_ALLOWED, "no pool fits")
        decided[lease.lease_id] = DrainMove(
            lease.lease_id, lease.task_id, lease.tenant_id, (),
            dict(no_placement_document(reason)),
        )
    return [decided[lease.lease_id] for lease in leases]
