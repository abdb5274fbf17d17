"""The scheduling core: pure placement decisions, no I/O.

One call decides where one task goes::

    TaskSpec --compile_spec--> CompiledSpec --------------.
    PoolState*, PlacedTask* --Snapshot.build--> Snapshot --+--> select(spec, snapshot, assumed)
                               Assumed (this pass) -------'          |
      visible pools only (tenant index)                              v
      PreFilter, memoized per (audience, placement class) and snapshot:
          tenant access -> runtime class -> pool status -> health
          -> region -> data residency -> pool selector
      Filter, per task over numpy arrays, first rejection wins:
          capacity -> required affinity
      Score each feasible pool 0..100 per plugin, x weight, summed:
          least loaded | most loaded, cost, preferred affinity, failure-domain spread,
          artifact locality
      Rank: total descending, then pool id ascending
      Gang: lazy plans (1 x N, 2 x ceil(N/2), ...) x lazy ranked candidates,
            then one last uneven plan (greedy over the ranked pools)
                                                                     |
                                                                     v
      Result(placement | NoPlacement, candidates, rejected, rejection_counts)
                                                                     |
                                                                     v
      explain: the stored and served documents (placement, pending reason, preview)

A pass plans with one pure function over one immutable input::

    PassInputs (inputs: snapshot, tasks, quota rows, holds, nominations, profile, settings,
    now) --plan_pass (planner)--> PassPlan (placements, hand-backs, displacements, holds
    given back, nominations begun and ended)

``plan_pass`` orders the tasks with a policy (``policies``) and the tasks that must borrow
by their tenants' shares (``fairshare``), decides each with ``decide``, records each
decision in ``Assumed`` so that the tasks after it see its usage and its labels, skips specs
already known to fit nowhere this pass (``unsatisfiable``), and hands tasks that fit nowhere
to the displacement planners (``displacement``: preempt, reclaim, fair-share reclaim,
nominate). The reconciler commits the plan; the previews read their own inputs and plan the
same way. See docs/scheduling.md.

Modules, in pipeline order: ``spec`` (TaskSpec, compile_spec, StoredSpecs), ``snapshot``
(PoolState, PlacedTask, Snapshot), ``assumed`` (Assumed), ``framework`` (select and decide:
the one pipeline) with ``prefilter`` (the class state), ``cycle``, ``stages`` and
``plugins/``, ``gangs``, ``reasons``, ``results`` (Result and its parts), ``explain`` (their
documents), ``unsatisfiable`` and ``policies``; then ``records`` (the plain records a pass
hands between its phases), ``inputs``, ``planner`` and ``displacement``. Import each name
from its module.
"""
