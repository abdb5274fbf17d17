"""Runtime instances: heartbeats (health and lease renewal) and the leases granted to one.

A runtime key acts only for the instances it names: another instance is 403 (the instance id
is in the path the caller chose, so saying no reveals nothing). A heartbeat commits before
:func:`runtime_heartbeat` returns.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.auth import Principal
from app.db import Database
from app.errors import Forbidden
from app.ledger import leases as ledger
from app.ledger.leases import HeartbeatResult

__all__ = ["RuntimeInstanceForbidden", "runtime_heartbeat", "runtime_leases"]


class RuntimeInstanceForbidden(Forbidden):
    """This runtime key does not act for that runtime instance."""


def instance_check(principal: Principal, instance_id: str) -> None:
    """Raise 403 unless ``principal`` acts for runtime instance ``instance_id``."""
    if instance_id not in principal.runtime_instance_ids:
        raise RuntimeInstanceForbidden(
            f"this key does not act for runtime instance {instance_id!r}"
        )


async def runtime_heartbeat(
    db: Database,
    *,
    principal: Principal,
    instance_id: str,
    now: datetime,
    lease_ttl_seconds: float,
    freshness_seconds: float,
) -> HeartbeatResult:
    """Record that the instance is alive and renew its live leases; commit, then return."""
    instance_check(principal, instance_id)
    async with db.transaction() as conn:
        return await ledger.runtime_heartbeat(
            conn,
            instance_id=instance_id,
            now=now,
            lease_ttl_seconds=lease_ttl_seconds,
            freshness_seconds=freshness_seconds,
        )


async def runtime_leases(
    db: Database, *, principal: Principal, instance_id: str
) -> list[dict[str, Any]]:
    """Return the instance's live leases, oldest grant first."""
    instance_check(principal, instance_id)
    async with db.connection() as conn:
        return await ledger.runtime_leases_list(conn, instance_id=instance_id)
