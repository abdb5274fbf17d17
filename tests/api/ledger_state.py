"""Ledger state for API tests, written straight into the tables as a reconciler would leave it.

The API tests need leased tasks and heartbeats without running a reconciler pass; these
functions write exactly the rows a pass writes (task LEASED, reservation, ledger reserved
totals, an ACTIVE lease), so the database's own invariants still hold.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.db import Database
from app.ledger.leases import lease_complete
from app.ledger.quotas import quota_usage_rebuild
from tests.api.conftest import RUNTIME_1, TENANT_A


@dataclass(frozen=True)
class HeldLease:
    """A lease written by :func:`lease_hold`."""

    id: uuid.UUID
    task_id: uuid.UUID
    epoch: int


async def lease_hold(
    db: Database,
    *,
    pool_id: str,
    amounts: tuple[int, int, int],
    instance_id: str = RUNTIME_1,
    tenant_id: str = TENANT_A,
    epoch: int = 1,
    expires_in: timedelta = timedelta(minutes=5),
) -> HeldLease:
    """Put one leased task on ``pool_id`` holding ``amounts`` and return its lease."""
    task_id, lease_id = uuid.uuid4(), uuid.uuid4()
    cpu, memory, llm = amounts
    now = datetime.now(UTC)
    spec = {
        "runtimeClass": "gpu-small",
        "requests": {"cpuMillis": cpu, "memoryMiB": memory, "llmSlots": llm},
    }
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO tasks (id, tenant_id, shard, state, runtime_class, spec, labels, "
            "attempts, leased_at) VALUES ($1, $2, 0, 'LEASED', 'gpu-small', $3, $4, $5, $6)",
            task_id, tenant_id, spec, {"app": "web"}, epoch - 1, now,
        )
        await conn.execute(
            "UPDATE ledgers SET cpu_reserved = cpu_reserved + $2, "
            "memory_reserved = memory_reserved + $3, llm_reserved = llm_reserved + $4 "
            "WHERE pool_id = $1",
            pool_id, cpu, memory, llm,
        )
        await conn.execute(
            "INSERT INTO reservations (task_id, pool_id, cpu, memory, llm) "
            "VALUES ($1, $2, $3, $4, $5)",
            task_id, pool_id, cpu, memory, llm,
        )
        await conn.execute(
            "INSERT INTO leases (id, task_id, pool_id, runtime_instance_id, epoch, granted_at, "
            "expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            lease_id, task_id, pool_id, instance_id, epoch, now, now + expires_in,
        )
        # The quota rows count the lease, as a placement's would.
        await quota_usage_rebuild(conn, runtime_classes=["gpu-small"])
    return HeldLease(id=lease_id, task_id=task_id, epoch=epoch)


async def lease_end(db: Database, *, lease: HeldLease) -> None:
    """Complete ``lease`` successfully through the ledger, releasing its capacity."""
    async with db.transaction() as conn:
        await lease_complete(
            conn,
            lease_id=lease.id,
            epoch=lease.epoch,
            outcome="succeeded",
            message=None,
            now=datetime.now(UTC),
        )


async def heartbeat_at(db: Database, *, instance_id: str, at: datetime) -> None:
    """Record the last heartbeat of ``instance_id`` at ``at``."""
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO runtime_instances (id, last_heartbeat_at) VALUES ($1, $2)", instance_id, at
        )
