"""Ledger state for API tests, written straight into the tables as a reconciler would leave it.

The API tests need leased tasks and heartbeats without running a reconciler pass; these
functions write exactly the rows a pass writes (task LEASED, reservation, ledger reserved
totals, an ACTIVE lease), so the database's own invariants still hold.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.ledger.leases import lease_complete
from app.ledger.tables import leases, ledgers, reservations, runtime_instances, tasks
from tests.api.conftest import RUNTIME_1, TENANT_A


@dataclass(frozen=True)
class HeldLease:
    """A lease written by :func:`lease_hold`."""

    id: uuid.UUID
    task_id: uuid.UUID
    epoch: int


async def lease_hold(
    db: AsyncEngine,
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
    async with db.begin() as conn:
        await conn.execute(
            insert(tasks).values(
                id=task_id,
                tenant_id=tenant_id,
                shard=0,
                state="LEASED",
                runtime_class="gpu-small",
                spec=spec,
                labels={"app": "web"},
                attempts=epoch - 1,
                leased_at=now,
            )
        )
        await conn.execute(
            update(ledgers)
            .where(ledgers.c.pool_id == pool_id)
            .values(
                cpu_reserved=ledgers.c.cpu_reserved + cpu,
                memory_reserved=ledgers.c.memory_reserved + memory,
                llm_reserved=ledgers.c.llm_reserved + llm,
            )
        )
        await conn.execute(
            insert(reservations).values(
                task_id=task_id, pool_id=pool_id, cpu=cpu, memory=memory, llm=llm
            )
        )
        await conn.execute(
            insert(leases).values(
                id=lease_id,
                task_id=task_id,
                pool_id=pool_id,
                runtime_instance_id=instance_id,
                epoch=epoch,
                granted_at=now,
                expires_at=now + expires_in,
            )
        )
    return HeldLease(id=lease_id, task_id=task_id, epoch=epoch)


async def lease_end(db: AsyncEngine, *, lease: HeldLease) -> None:
    """Complete ``lease`` successfully through the ledger, releasing its capacity."""
    async with db.begin() as conn:
        await lease_complete(
            conn,
            lease_id=lease.id,
            epoch=lease.epoch,
            outcome="succeeded",
            message=None,
            now=datetime.now(UTC),
        )


async def heartbeat_at(db: AsyncEngine, *, instance_id: str, at: datetime) -> None:
    """Record the last heartbeat of ``instance_id`` at ``at``."""
    async with db.begin() as conn:
        await conn.execute(insert(runtime_instances).values(id=instance_id, last_heartbeat_at=at))
