"""The reconciler: turns admitted tasks into leased placements.

A pass (:mod:`app.reconciler.passes`) is claim -> read -> plan -> commit::

    claim (SKIP LOCKED, owned slots) -> read (reading.py: one PassInputs)
      -> plan_pass (app.scheduling.planner: pure, policy order, displacement planners)
      -> commit (committing.py: plan_apply, ledger last)
           `-- lost race: re-read, walk (walk.py), settle

Around it, :class:`Reconciler` (:mod:`app.reconciler.loop`) runs passes on wakeups
(LISTEN/NOTIFY) and a tick, owns shard slots statically or through advisory locks
(:mod:`app.reconciler.ownership`), and, as the elected leader, recovers expired leases and
overdue drains. ``berth reconcile`` is :func:`app.reconciler.process.run_reconciler`;
``berth serve`` runs the same reconciler through
:func:`app.reconciler.process.reconciler_background`. No SQL here: it is in ``app.ledger``.
See docs/reconciler.md for the design and its failure modes.
"""

from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from app.reconciler.passes import PassResult

__all__ = ["PassResult", "Reconciler", "ReconcilerConfig"]
