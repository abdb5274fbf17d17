"""Drain preview: where a pool's work would go if its leases were revoked now; writes nothing.

When a drain's deadline passes, every live lease on the pool is revoked: each task gives back
all its leases and reservations (a gang's members on other pools too) and is admitted again
(or fails, if that was its last attempt). The preview answers, for each live lease, what the
next pass would do with its task, by the pass's own planner: the pool rows as a pass reads them
(:func:`app.ledger.snapshot.snapshot_read`), with the drained pool DRAINING and the capacity the
moving tasks hold elsewhere given back, are the snapshot of a
:class:`~app.scheduling.inputs.PassInputs` whose tasks are the moving ones, and
:func:`app.scheduling.planner.plan_pass` plans them as a pass would (policy order, each
seeing the earlier ones' placements). Quotas too: the tenants' quota rows of the moving
tasks' runtime classes, less the usage the revoked leases give back, are the pass's quota
book, so a task its tenant's quota would refuse waits with ``quota_exceeded`` or
``quota_borrow_unavailable``. Nothing is reserved and nothing is written: a drain started
right after may still see the ledger move.

The API process checks that the caller may operate the pool (:func:`drain_allowed`) and
sends the ask (:class:`DrainAsk`) to a preview worker (:mod:`app.services.offload`), which
reads (:func:`drain_inputs_read`, with the pools' snapshot it keeps between previews) and
decides (:func:`drain_decide`, pure).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from app.auth import Principal
from app.db import Connection, Database
from app.ledger.drains import (
    LeaseMoving,
    drain_leases_decode,
    drain_leases_packed_read,
    drain_released_read,
    drain_usage_returned_read,
)
from app.ledger.quotas import (
    RESOURCES,
    CohortRow,
    QuotaRow,
    quota_read,
)
from app.ledger.snapshot import (
    SnapshotCache,
    placements_read,
    snapshot_read,
    tenant_usage_read,
)
from app.ledger.tenants import tenants_entitlements
from app.pass_config import ReconcilerConfig
from app.scheduling.explain import error_document
from app.scheduling.inputs import PassInputs
from app.scheduling.planner import Placed, plan_outcomes
from app.scheduling.plugins.quota import cohort_rows_drawn
from app.scheduling.plugins.registry import profile
from app.scheduling.records import ClaimedTask
from app.scheduling.snapshot import PlacedTask, PoolState, Snapshot
from app.scheduling.spec import StoredSpecs
from app.services.pools import pool_operated, pool_viewer

__all__ = [
    "ATTEMPTS_EXHAUSTED", "DrainAsk", "DrainInputs", "DrainMove", "drain_allowed",
    "drain_decide", "drain_inputs_read",
]

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
    #: The quota tree's rows, with what the revoked leases draw given back at every level,
    #: and the tenants' fair weights.
    quota_cohorts: list[CohortRow] = field(default_factory=list)
    tenant_weights: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DrainAsk:
    """What a drain preview asks, as the API process sends it to a worker."""

    pool_id: str
    config: ReconcilerConfig
    now: datetime


async def drain_allowed(db: Database, *, principal: Principal, pool_id: str) -> None:
    """Return when ``principal`` may preview a drain of ``pool_id``: 404 when it cannot see
    the pool, 403 when it may not operate it."""
    async with db.connection() as conn:
        await pool_operated(conn, viewer=pool_viewer(principal), pool_id=pool_id,
                            action="preview a drain of")


async def _no_placements() -> list[PlacedTask]:
    return []


async def drain_inputs_read(
    conn: Connection, ask: DrainAsk, *, cache: SnapshotCache
) -> DrainInputs:
    """Read what revoking every live lease of the asked pool now depends on, with the pools'
    snapshot kept in ``cache``; decides nothing."""
    pool_id, config, now = ask.pool_id, ask.config, ask.now
    # The leases come as one text, decoded by the worker that decides.
    leases, tenants = await drain_leases_packed_read(conn, pool_id=pool_id)
    if not tenants:
        return DrainInputs("[]", [], [], config, {}, now, [], {}, None)
    released = await drain_released_read(conn, pool_id=pool_id)
    snapshot = await snapshot_read(
        conn, now=now, freshness_seconds=config.heartbeat_freshness_seconds,
        strategy=config.strategy, placed=_no_placements, cache=cache,
    )
    # The moving tasks have left their pools: affinity no longer counts them there.
    placed = await placements_read(conn, tenant_ids=tenants, leaving=pool_id)
    usage = await tenant_usage_read(conn, tenant_ids=tenants) if config.policy == "fair" else {}
    returned = await drain_usage_returned_read(conn, pool_id=pool_id)
    classes = {rc for _, rc in returned}
    quota = await quota_read(conn, runtime_classes=classes, tenant_ids=tenants)
    rows = list(quota.rows)
    given_back = _returned(rows, returned)
    entitlements = (
        await tenants_entitlements(conn, tenant_ids=tenants)
        if config.policy == "fair" and rows else None
    )
    return DrainInputs(
        leases, _without(list(snapshot.pools), pool_id=pool_id, released=released), placed,
        config, usage, now, given_back, dict(quota.cohorts), entitlements,
        cohort_rows_drawn(list(quota.tree), rows, given_back), dict(quota.weights),
    )


def drain_decide(inputs: DrainInputs) -> list[DrainMove]:
    """Return, for each moving lease, where its task would be placed (or why it would
    wait), in the leases' order; pure."""
    leases = drain_leases_decode(inputs.leases)
    if not leases:
        return []
    snapshot = Snapshot.build(inputs.pools, inputs.placed, strategy=inputs.config.strategy)
    return _plan_all(leases, snapshot, config=inputs.config, usage=inputs.usage,
                     now=inputs.now, quota_rows=tuple(inputs.quota_rows),
                     cohorts=inputs.cohorts, entitlements=inputs.entitlements,
                     quota_cohorts=tuple(inputs.quota_cohorts),
                     tenant_weights=inputs.tenant_weights)


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


def _plan_all(
    leases: list[LeaseMoving],
    snapshot: Snapshot,
    *,
    config: ReconcilerConfig,
    usage: dict[str, tuple[int, int, int]],
    now: datetime,
    quota_rows: tuple[QuotaRow, ...] = (),
    cohorts: Mapping[str, str] | None = None,
    entitlements: Mapping[str, tuple[float, float, float]] | None = None,
    quota_cohorts: tuple[CohortRow, ...] = (),
    tenant_weights: Mapping[str, float] | None = None,
) -> list[DrainMove]:
    """Plan the moving tasks as a pass would; return one move per lease, in the leases'
    order (a task on its last attempt would fail: it is not planned)."""
    decided: dict[uuid.UUID, DrainMove] = {}
    moving: list[ClaimedTask] = []
    for lease in leases:
        if lease.attempts + 1 >= lease.max_attempts:
            decided[lease.lease_id] = DrainMove(
                lease.lease_id, lease.task_id, lease.tenant_id, (), dict(error_document(
                    ATTEMPTS_EXHAUSTED,
                    "revoking its lease would fail the task: it is on its last attempt "
                    f"({lease.attempts + 1} of {lease.max_attempts})",
                )),
            )
            continue
        moving.append(ClaimedTask(lease.task_id, lease.tenant_id, lease.seq, lease.priority,
                                  lease.spec_json, lease.admitted_at, lease.attempts))
    compiled, invalid = StoredSpecs(len(moving) or 1).compile_all(moving)
    inputs = PassInputs(
        now=now, settings=config.pass_settings(), profile=profile(config.strategy),
        snapshot=snapshot, tasks=tuple(compiled),
        invalid=tuple(invalid), usage=usage, entitlements=entitlements,
        quota_rows=quota_rows, cohorts=cohorts or {},
        quota_cohorts=quota_cohorts, tenant_weights=tenant_weights or {},
    )
    outcomes = plan_outcomes(inputs)
    for lease in leases:
        if lease.lease_id in decided:
            continue
        out = outcomes[lease.task_id]
        if isinstance(out, Placed):
            decided[lease.lease_id] = DrainMove(
                lease.lease_id, lease.task_id, lease.tenant_id, out.members, None)
        else:
            decided[lease.lease_id] = DrainMove(
                lease.lease_id, lease.task_id, lease.tenant_id, (),
                dict(out.pending_reason or {}))
    return [decided[lease.lease_id] for lease in leases]
