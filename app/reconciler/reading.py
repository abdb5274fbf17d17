"""The read phase of a pass: everything its planner needs, read once into a
:class:`~app.scheduling.inputs.PassInputs`.

In the pass's transaction, after the claim:

* the claimed tasks' specs, compiled (a spec that cannot be read is set apart with why);
* the snapshot: ledgers and runtime health at the pass's ``now`` on top of the previous
  pass's static part (:class:`~app.ledger.snapshot.SnapshotCache`), actual placements for
  tenants whose tasks carry affinity terms, tenant usage only under ``fair``;
* the quota rows of the tasks' runtime classes, with the needs of the preemptors and
  reclaimers still waiting counted as their tenants' usage and the usage of the leases
  being revoked for them given back once (:func:`~app.scheduling.reclaim.displacers_counted`;
  read when some tenant borrows or some preemptor or reclaimer waits), and, only when some
  tenant borrows, the leases a reclaim could take;
* with quota rows, the fair weights of their tenants and the pass's, and with a usage
  half-life the pass's tenants' decayed usage (brought up to the pass's ``now``);
* the holds of the tasks that may hold capacity (preemptors, reclaimers, nominees, possible
  nominees), whose victims are still stopping, and the leases the preemptors may take;
* the nominations, the head of each concerned runtime class's queue, and for each possible
  nominee what lower-ranked work reserves on the pools of its class.

Each read is skipped when no claimed task could use it.

Before its first pass a starting reconciler reads the pools ahead (:func:`snapshot_ahead`),
so that the first pass, like every later one, reads only the rows written since.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from app.db import Connection
from app.ledger.fairshare import fair_usage_decay, fair_weights_read
from app.ledger.nominations import class_heads_read, lower_usage_read, nominations_read
from app.ledger.preemption import holds_read, preemptors_waiting, victims_read
from app.ledger.quotas import quota_rows_read, quota_tree_read
from app.ledger.reclaim import displacers_count, reclaim_victims_read
from app.ledger.snapshot import (
    SnapshotCache,
    placements_grouped_read,
    snapshot_read,
    tenant_usage_read,
)
from app.ledger.tenants import tenants_entitlements
from app.pass_config import ReconcilerConfig
from app.scheduling.displacement.nominate import CANDIDATES_MAX, class_head, pending_since
from app.scheduling.inputs import NominationInputs, PassInputs, ReclaimInputs
from app.scheduling.plugins.quota import QuotaRow, cohort_rows_drawn
from app.scheduling.plugins.registry import profile
from app.scheduling.records import PREEMPTING, RECLAIMING, ClaimedTask, Vector
from app.scheduling.snapshot import PlacedTask, Snapshot
from app.scheduling.spec import CompiledSpec, StoredSpecs

__all__ = ["pass_read", "snapshot_ahead"]

Compiled = list[tuple[ClaimedTask, CompiledSpec]]


async def pass_read(
    conn: Connection, *, config: ReconcilerConfig, claimed: Sequence[ClaimedTask],
    specs: StoredSpecs, cache: SnapshotCache, now: datetime,
) -> PassInputs:
    """Read the inputs of a pass that claimed ``claimed`` at ``now``."""
    compiled, invalid = specs.compile_all(claimed)
    affinity = {spec.tenant_id for _, spec in compiled if spec.required or spec.preferred}
    tenants = {t.tenant_id for t in claimed}
    snapshot = await snapshot_read(
        conn, now=now, freshness_seconds=config.heartbeat_freshness_seconds,
        strategy=config.strategy,
        placed=lambda: placements_grouped_read(conn, tenant_ids=affinity),
        cache=cache,
    )
    fair = config.policy == "fair"
    usage = await tenant_usage_read(conn, tenant_ids=tenants) if fair else {}
    classes = {spec.runtime_class for _, spec in compiled}
    rows, cohorts = await quota_rows_read(conn, runtime_classes=classes, tenant_ids=tenants)
    tree, _, of = await quota_tree_read(conn, runtime_classes=classes, tenant_ids=tenants)
    cohorts = {**of, **cohorts}
    reclaim = None
    if rows:
        read = rows
        rows, reclaim = await _reclaim_read(conn, rows, compiled, snapshot, config, now)
        if rows is not read:
            tree = cohort_rows_drawn(tree, read, rows)
    entitlements = await tenants_entitlements(conn, tenant_ids=tenants) if fair and rows else None
    weights, fair_usage = await _fair_read(
        conn, {r.tenant_id for r in rows},
        {r.runtime_class for r in rows} | {c.runtime_class for c in tree}, tenants,
        config, now)
    nomination = await _nominations_read(conn, compiled, snapshot, config, now)
    holders = [t.id for t, spec in compiled
               if spec.may_preempt or t.pending_code in (PREEMPTING, RECLAIMING)]
    nominees, possible = _possible_holders(nomination, compiled)
    extra = nominees + possible
    holds = await holds_read(conn, task_ids=holders + extra) if holders or extra else {}
    for task_id in nominees:
        # A claimed nominee decides with its holds, even none yet.
        holds.setdefault(task_id, {})
    return PassInputs(
        now=now, settings=config.pass_settings(), profile=profile(config.strategy),
        snapshot=snapshot, tasks=tuple(compiled),
        invalid=tuple(invalid), usage=usage, entitlements=entitlements,
        quota_rows=tuple(rows), cohorts=cohorts, quota_cohorts=tuple(tree),
        tenant_weights=weights, fair_usage=fair_usage, holds=holds,
        waiting=await preemptors_waiting(conn, task_ids=holders) if holders else {},
        victims=tuple(await _victims_read(conn, compiled)), reclaim=reclaim,
        nomination=nomination,
    )


async def snapshot_ahead(
    conn: Connection, *, config: ReconcilerConfig, cache: SnapshotCache, now: datetime,
) -> Snapshot:
    """Read the pools, their ledgers and runtime health into ``cache`` at ``now``, as a
    pass's read would (without placements: each pass reads its own), and return the
    snapshot."""
    return await snapshot_read(
        conn, now=now, freshness_seconds=config.heartbeat_freshness_seconds,
        strategy=config.strategy, placed=_no_placements, cache=cache,
    )


async def _no_placements() -> list[PlacedTask]:
    return []


async def _fair_read(
    conn: Connection, quota_tenants: Collection[str], classes: Collection[str],
    tenants: Collection[str], config: ReconcilerConfig, now: datetime,
) -> tuple[dict[str, float], dict[tuple[str, str], tuple[float, float, float]] | None]:
    """Return the fair weights of the tenants with quota rows and of the pass (when some
    class is managed), and with a usage half-life, the pass's tenants' decayed usage in the
    managed ``classes`` (brought up to ``now``)."""
    if not classes:
        return {}, None
    weights = await fair_weights_read(conn, tenant_ids=set(quota_tenants) | set(tenants))
    if config.fair_usage_half_life_seconds <= 0:
        return weights, None
    decayed = await fair_usage_decay(
        conn, tenant_ids=tenants, runtime_classes=classes,
        half_life_seconds=config.fair_usage_half_life_seconds, now=now)
    return weights, decayed


def _possible_holders(
    nomination: NominationInputs | None, compiled: Compiled
) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Return the claimed nominees and the possible nominees (holds of their own make them
    no candidates)."""
    if nomination is None:
        return [], []
    claimed = {t.id for t, _ in compiled}
    nominees = {n.task_id for n in nomination.nominations if n.task_id in claimed}
    return sorted(nominees), sorted(set(nomination.lower) - nominees)


async def _victims_read(conn: Connection, compiled: Compiled) -> list:
    """Return the leased tasks the claimed preemptors' tenants may displace."""
    below: dict[str, int] = {}
    for t, spec in compiled:
        if spec.may_preempt:
            below[t.tenant_id] = max(below.get(t.tenant_id, t.priority), t.priority)
    return await victims_read(conn, below=below) if below else []


async def _reclaim_read(
    conn: Connection, rows: list[QuotaRow], compiled: Compiled, snapshot: Snapshot,
    config: ReconcilerConfig, now: datetime,
) -> tuple[list[QuotaRow], ReclaimInputs]:
    """Return the quota rows with the waiting preemptors and reclaimers counted, and what
    reclaim plans from (its victims only when some tenant of the rows borrows)."""
    classes = {r.runtime_class for r in rows}
    cutoff = now - timedelta(seconds=config.reclaim_min_runtime_seconds)
    # A waiting preemptor or reclaimer is judged by its quota with its victims stopped.
    waiting = any(t.pending_code in (PREEMPTING, RECLAIMING) and spec.runtime_class in classes
                  for t, spec in compiled)
    rows, waits, revoking = await displacers_count(
        conn, rows, revoking_wanted=waiting or any(r.used > r.nominal for r in rows))
    lenders = {r.tenant_id for r in rows if r.used > r.nominal}
    if not lenders:
        return rows, ReclaimInputs(waits, revoking, leased_before=cutoff.timestamp())
    codes = {snapshot.rc_table[rc] for rc in classes if rc in snapshot.rc_table}
    pools = [p for i, p in enumerate(snapshot.ids) if int(snapshot.rc[i]) in codes]
    victims = await reclaim_victims_read(
        conn, tenant_ids=lenders, pool_ids=pools, leased_before=cutoff)
    return rows, ReclaimInputs(waits, revoking, tuple(victims), cutoff.timestamp())


async def _nominations_read(
    conn: Connection, compiled: Compiled, snapshot: Snapshot, config: ReconcilerConfig,
    now: datetime,
) -> NominationInputs | None:
    """Return what nominations plan from (None with nominations off)."""
    if config.nomination_seconds <= 0:
        return None
    nominations = tuple(await nominations_read(conn))
    cutoff = now - timedelta(seconds=config.nomination_seconds)
    nominees = {n.task_id for n in nominations}
    waited = [(t, spec) for t, spec in compiled if t.id not in nominees
              and (since := pending_since(t)) is not None and since <= cutoff]
    classes = {spec.runtime_class for t, spec in waited} | {
        spec.runtime_class for t, spec in compiled if t.id in nominees}
    if not classes:
        return NominationInputs(nominations)
    by_priority = config.policy == "priority"
    heads = await class_heads_read(conn, runtime_classes=classes, limit=len(compiled) + 1,
                                   by_priority=by_priority)
    lower = await _lower_read(conn, waited, heads, snapshot, {t.id for t, _ in compiled},
                              by_priority=by_priority)
    return NominationInputs(nominations, heads, lower)


async def _lower_read(
    conn: Connection, waited: Compiled, heads: dict, snapshot: Snapshot,
    ours: Collection[uuid.UUID], *, by_priority: bool,
) -> dict[uuid.UUID, dict[str, Vector]]:
    """Return, for the waiting tasks that could be first of their class once the tasks of
    the pass (``ours``) ahead of them are placed, what lower-ranked work reserves on the
    pools of their class (at most twice the candidates a pass plans)."""
    rc_pools: dict[str, list[str]] = {}
    lower: dict[uuid.UUID, dict[str, Vector]] = {}
    for t, spec in waited:
        if len(lower) >= 2 * CANDIDATES_MAX:
            break
        if not class_head(heads.get(spec.runtime_class, ()), t, by_priority=by_priority,
                          placed=ours):
            continue
        code = snapshot.rc_table.get(spec.runtime_class)
        if code is None:
            continue
        pools = rc_pools.get(spec.runtime_class)
        if pools is None:
            pools = rc_pools[spec.runtime_class] = [
                snapshot.ids[i] for i in (snapshot.rc == code).nonzero()[0].tolist()]
        lower[t.id] = await lower_usage_read(conn, pool_ids=pools, priority=t.priority,
                                             seq=t.seq, by_priority=by_priority)
    return lower
