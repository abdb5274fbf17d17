"""The reconciler: turns admitted tasks into leased placements (SPEC §5).

Pipeline of one pass (:mod:`app.reconciler.passes`)::

    claim (SKIP LOCKED, owned slots) -> snapshot (one read) -> select (pure core, policy
    order, assumed usage) -> reserve + lease + LEASED (one transaction, ledger last)

Around it, :class:`Reconciler` (:mod:`app.reconciler.loop`) runs passes on wakeups
(LISTEN/NOTIFY) and a tick, owns shard slots statically or through advisory locks
(:mod:`app.reconciler.ownership`), and, as the elected leader, recovers expired leases and
overdue drains. ``berth reconcile`` is :func:`app.reconciler.process.run_reconciler`.
See docs/reconciler.md for the design and its failure modes.
"""

from app.reconciler.config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from app.reconciler.passes import PassResult

__all__ = ["PassResult", "Reconciler", "ReconcilerConfig"]
