"""Placement preview: the pass's planner on the live snapshot; it writes nothing.

The preview reads what a reconciler pass reads for one task (pools, ledgers, heartbeat
freshness, the tenant's placed tasks for affinity, the quota rows of the spec's runtime
class, and the tenant's lower-priority leases for a spec that may preempt) into a
:class:`~app.scheduling.inputs.PassInputs` of that one task, and plans it with
:func:`app.scheduling.planner.plan_pass` explaining: every candidate and rejection, a spec
over its tenant's quota refused with ``quota_exceeded`` or ``quota_borrow_unavailable`` and
the numbers, and for a spec that may preempt and fits nowhere (but within its quota) the
preemption a pass would make, with every candidate pool and the victims each would need. A
task submitted right after may still land elsewhere if the ledger moves.

The preview runs in a preview worker (:mod:`app.services.offload`): the API process compiles
the spec and sends it (:class:`PlacementAsk`); the worker reads with the pools' snapshot it
keeps between previews (refreshed from the rows written since its previous read, as a pass
does) and decides (:func:`placement_decide`, pure). Its read starts after the request began,
so it reflects every change committed before.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from app.auth import Principal
from app.db import Connection
from app.ledger.preemption import victims_read
from app.ledger.quotas import quota_read
from app.ledger.snapshot import SnapshotCache, placements_grouped_read, snapshot_read
from app.pass_config import ReconcilerConfig
from app.scheduling.inputs import PassInputs
from app.scheduling.planner import plan_pass
from app.scheduling.plugins.registry import profile
from app.scheduling.preemption import Preemption
from app.scheduling.records import ClaimedTask
from app.scheduling.results import Result
from app.scheduling.spec import CompiledSpec, TaskSpec, compile_spec
from app.services.tenancy import tenant_acting

__all__ = [
    "PlacementAsk", "PlacementInputs", "placement_ask", "placement_decide",
    "placement_inputs_read",
]

#: Ranked candidates a preview's placement keeps (the pipeline's default depth).
PREVIEW_TOP_K = 5


@dataclass(frozen=True, slots=True)
class PlacementInputs:
    """What a placement preview decides on: the compiled spec and the inputs of a pass whose
    only task it is."""

    spec: CompiledSpec
    task_id: uuid.UUID
    inputs: PassInputs


@dataclass(frozen=True, slots=True)
class PlacementAsk:
    """What a placement preview asks, as the API process sends it to a worker."""

    spec: CompiledSpec
    strategy: str
    freshness_seconds: float


def placement_ask(
    principal: Principal, *, tenant: str | None, spec: TaskSpec, freshness_seconds: float,
    strategy: str,
) -> PlacementAsk:
    """Return the ask of previewing ``spec`` for the tenant ``principal`` acts as."""
    compiled = compile_spec(spec, tenant_id=tenant_acting(principal, tenant))
    return PlacementAsk(compiled, strategy, freshness_seconds)


async def placement_inputs_read(
    conn: Connection, ask: PlacementAsk, *, cache: SnapshotCache, components: int | None = None,
) -> PlacementInputs:
    """Read what placing the asked spec now depends on, with the snapshot kept in ``cache``;
    decides nothing. The best ``components`` candidates (None: all) are to carry their score
    components."""
    compiled, strategy = ask.spec, ask.strategy
    tenant_id = compiled.tenant_id
    now = datetime.now(UTC)
    # Every pool is read, as in a pass; the core shows the tenant only the pools listing it.
    affinity = [tenant_id] if compiled.required or compiled.preferred else []
    snapshot = await snapshot_read(
        conn, now=now, freshness_seconds=ask.freshness_seconds, strategy=strategy,
        placed=lambda: placements_grouped_read(conn, tenant_ids=affinity), cache=cache,
    )
    quota = await quota_read(
        conn, runtime_classes=[compiled.runtime_class], tenant_ids=[tenant_id]
    )
    victims = (
        await victims_read(conn, below={tenant_id: compiled.priority})
        if compiled.may_preempt else []
    )
    config = ReconcilerConfig(strategy=strategy,
                              heartbeat_freshness_seconds=ask.freshness_seconds)
    task = ClaimedTask(uuid.uuid4(), tenant_id, 0, compiled.priority, "", now, 0)
    inputs = PassInputs(
        now=now, settings=dataclasses.replace(
            config.pass_settings(), top_k=PREVIEW_TOP_K, explain=True,
            explain_components=components),
        profile=profile(strategy), snapshot=snapshot,
        tasks=((task, compiled),), quota_rows=quota.rows, cohorts=quota.cohorts,
        quota_cohorts=quota.tree, tenant_weights=quota.weights,
        victims=tuple(victims),
    )
    return PlacementInputs(compiled, task.id, inputs)


def placement_decide(inputs: PlacementInputs) -> tuple[Result, Preemption | None]:
    """Return the explained result of placing the spec (every candidate and rejection) and,
    for a preemptor that fits nowhere, the preemption it would make; pure."""
    plan = plan_pass(inputs.inputs)
    return plan.explained[inputs.task_id], plan.preemptions.get(inputs.task_id)
