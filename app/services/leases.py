"""Lease completion: a runtime reports its task's outcome, fenced by the lease's epoch.

The completion, its idempotency record and the capacity release commit together in one
transaction, before :func:`lease_complete` returns. The lease must belong to one of the
key's runtime instances before anything else happens, a stored answer's replay included:
a replay is authorized exactly like a first request.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from app.auth import Principal
from app.db import Database
from app.ledger import leases as ledger
from app.metrics import LEASES_COMPLETED, PREEMPTION_VICTIMS
from app.services.idempotency import Answer, Idempotency, idempotent, request_hash

__all__ = ["OPERATION", "lease_complete"]

#: The idempotency operation name of lease completion.
OPERATION = "completeLease"


async def lease_complete(
    db: Database,
    *,
    principal: Principal,
    lease_id: uuid.UUID,
    outcome: str,
    epoch: int,
    message: str | None,
    idempotency_key: str | None,
) -> Answer:
    """Finish the lease's task with ``outcome`` if the lease is the caller's and live at
    ``epoch``; return the answer (replayed for a repeat with the same Idempotency-Key)."""
    idempotency = None
    if idempotency_key is not None:
        body = {"outcome": outcome, "epoch": epoch, "message": message}
        assert principal.key_id is not None
        idempotency = Idempotency(
            key_id=principal.key_id,
            operation=OPERATION,
            key=idempotency_key,
            request_hash=request_hash({"leaseId": str(lease_id), "body": body}),
        )

    revoking: list[bool] = []
    async with db.transaction() as conn:
        await ledger.lease_check_owner(
            conn, lease_id=lease_id, instance_ids=principal.runtime_instance_ids
        )

        async def perform() -> Answer:
            result = await ledger.lease_complete(
                conn,
                lease_id=lease_id,
                epoch=epoch,
                outcome=outcome,
                message=message,
                now=datetime.now(UTC),
                instance_ids=principal.runtime_instance_ids,
            )
            revoking.append(result.pop("revoking"))
            # The answer as the API sends it (RFC 3339 with Z), so a replay is the same text.
            finished = result["finishedAt"].replace("+00:00", "Z")
            return Answer(200, {**result, "finishedAt": finished})

        answer = await idempotent(conn, idempotency, perform)
    if answer.replayed:
        return answer
    LEASES_COMPLETED.labels(outcome=outcome).inc()
    if any(revoking):  # committed: a victim finished or gave its work back in its grace period
        PREEMPTION_VICTIMS.labels(
            outcome="released" if outcome == "released" else "completed"
        ).inc()
    return answer
