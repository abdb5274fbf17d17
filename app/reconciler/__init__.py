"""The reconciler: turns admitted tasks into leased placements.

Pipeline of one pass (:mod:`app.reconciler.passes`)::

    claim (SKIP LOCKED, owned slots) -> snapshot (one read) -> select (pure core, policy
    order, assumed usage) -> Plan -> plan_apply (one transaction, ledger last)
                                       `-- lost race: re-read, walk (walk.py), new Plan

The pass decides purely and produces a :class:`~app.ledger.plans.Plan`;
:func:`~app.ledger.plans.plan_apply` writes it whole or returns the pools that lost a race,
and :mod:`app.reconciler.walk` moves the affected tasks to their next candidates.

Around it, :class:`Reconciler` (:mod:`app.reconciler.loop`) runs passes on wakeups
(LISTEN/NOTIFY) and a tick, owns shard slots statically or through advisory locks
(:mod:`app.reconciler.ownership`), and, as the elected leader, recovers expired leases and
overdue drains. ``berth reconcile`` is :func:`app.reconciler.process.run_reconciler`;
``berth serve`` runs the same reconciler through
:func:`app.reconciler.process.reconciler_background`. No SQL here: it is in ``app.ledger``.
See docs/reconciler.md for the design and its failure modes.
"""

from app.reconciler.config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from app.reconciler.passes import PassResult

__all__ = ["PassResult", "Reconciler", "ReconcilerConfig"]
