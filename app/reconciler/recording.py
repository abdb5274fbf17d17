"""Recording a committed pass: its inputs and decisions, in its own transaction.

After the commit phase, :meth:`Recorder.record` encodes the pass's
:class:`~app.scheduling.inputs.PassInputs` and the decisions of its plan
(:mod:`app.scheduling.recording`) and writes them with
:func:`~app.ledger.pass_records.pass_record_add`: the record commits with the pass or not
at all. The static pools, which passes share while no pool row changes, are encoded once per
snapshot build and stored once per digest; the recorder stores them again (or marks them
used) at most every quarter of the retention, so pruning never takes pools a record is about
to name.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.db import Connection
from app.ledger.pass_records import pass_record_add, pass_record_pools_touch
from app.scheduling.inputs import PassInputs
from app.scheduling.planner import PassPlan
from app.scheduling.recording import decisions_packed, inputs_encode, pools_encode
from app.scheduling.snapshot import PoolState, Snapshot

__all__ = ["Recorder"]


class Recorder:
    """Records committed passes; keeps the encoded static pools of the last snapshot build."""

    def __init__(self, retention_seconds: float) -> None:
        self.retention_seconds = retention_seconds
        #: The static pools last encoded (kept alive so their identity is not reused), their
        #: digest and bytes, and when they were last stored.
        self._pools: tuple[PoolState, ...] | None = None
        self._digest = ""
        self._blob = b""
        self._stored: datetime | None = None

    def pools_encoded(self, snapshot: Snapshot) -> None:
        """Encode the static pools of ``snapshot`` unless they are those encoded last (a
        starting reconciler encodes them ahead of its first record)."""
        static = snapshot.static_pools
        if static is not self._pools:
            digest, blob = pools_encode(snapshot)
            if digest != self._digest:
                self._digest, self._blob, self._stored = digest, blob, None
            self._pools = static

    async def record(
        self, conn: Connection, *, pass_id: str, inputs: PassInputs, plan: PassPlan
    ) -> int:
        """Record the pass ``pass_id`` planned from ``inputs``; return the bytes stored for
        it (the static pools counted when this pass stored them)."""
        now = inputs.now
        self.pools_encoded(inputs.snapshot)
        stored = 0
        if self._stored is None or now - self._stored > timedelta(
                seconds=self.retention_seconds / 4):
            await pass_record_pools_touch(conn, digest=self._digest, pools=self._blob, now=now)
            self._stored = now
            stored = len(self._blob)
        digest, out = decisions_packed(plan)
        body = inputs_encode(inputs)
        await pass_record_add(
            conn, pass_id=pass_id, recorded_at=now, pools_digest=self._digest,
            task_ids=[t.id for t, _ in inputs.tasks] + [t.id for t, _ in inputs.invalid],
            placed=len(plan.placed), plan_digest=digest, inputs=body, decisions=out,
        )
        return stored + len(body) + len(out)
