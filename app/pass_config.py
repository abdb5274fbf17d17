"""How passes are run and decided: one dataclass with documented defaults, built from Settings.

The reconciler runs its passes with it, and the previews (placement, drain) read the part
that decides (:meth:`ReconcilerConfig.pass_settings`) to plan as a pass would. A field that
is also a setting takes its default from :class:`~app.config.Settings` (the one place of that
default, in the setting's unit); the others are the reconciler's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.config import Settings
from app.scheduling.inputs import PassSettings


def _setting(name: str, scale: float = 1.0) -> Any:
    """Return the default of the setting ``name`` (times ``scale``, to convert its unit)."""
    default = Settings.model_fields[name].default
    return default if scale == 1.0 else default * scale


#: Ranked candidates kept per decision unless the walk limit needs more.
TOP_K_DEFAULT = 4


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    """How a reconciler claims, schedules, retries, wakes up and recovers leases."""

    #: Tasks claimed per pass.
    batch_size: int = _setting("batch_size")
    #: Longest a pass may sit idle in its transaction while holding its claims (row locks):
    #: past it the server ends the session, the pass rolls back and its tasks are claimable
    #: again (a reconciler that hangs without dying).
    claim_ttl_seconds: float = _setting("claim_ttl_seconds")
    #: Lease expiry after grant and after each heartbeat.
    lease_ttl_seconds: float = _setting("lease_ttl_seconds")
    #: A runtime is healthy while its last heartbeat is newer than this.
    heartbeat_freshness_seconds: float = _setting("heartbeat_freshness_seconds")
    #: Next-ranked candidates one task may walk to, over a pass, after its reservation lost
    #: a race (per task; gangs never walk).
    reservation_walk_limit: int = _setting("reservation_walk_limit")
    #: Reserving rounds of one pass. Each lost race costs a round (the pass re-reads the
    #: refusing pools and walks only the grants on them, in its one transaction); when the
    #: last round still loses, the placements left go back to the queue unparked.
    commit_rounds_max: int = _setting("commit_rounds_max")
    #: Tries of a transaction that failed transiently (serialization, deadlock, connection).
    retry_attempts: int = _setting("retry_attempts")
    #: First retry backoff; doubles each try, with full jitter.
    retry_base_delay_seconds: float = _setting("retry_base_delay_ms", 1 / 1000)
    #: Cap of one retry backoff.
    retry_max_delay_seconds: float = 2.0
    #: A pass without any wakeup every this many seconds (it re-takes expired claims; it
    #: does not unpark parked tasks).
    tick_seconds: float = _setting("tick_seconds")
    #: The safety sweep: every parked task of the owned slots is re-examined about this
    #: often (jittered by ±25 %), in case a wakeup was missed. Re-examining a task still
    #: pending for the same reason writes no event, and a re-examined task logs at most one
    #: change of its pending reason per this period.
    park_sweep_seconds: float = _setting("park_sweep_seconds")
    #: Events a task keeps besides its first once it logged more pending-reason events than
    #: this: each new one then deletes its oldest (a task that never finishes is never
    #: pruned, so its history must be bounded on its own).
    task_events_kept: int = _setting("task_events_kept")
    #: How often dynamic ownership re-reads the live replicas and rebalances slots; a dead
    #: replica's slots are taken over within about this long.
    rebalance_seconds: float = 2.0
    #: How often the leader looks for expired leases and overdue drains.
    recovery_seconds: float = 1.0
    #: Leases recovered per recovery transaction.
    recovery_batch: int = 500
    #: Idempotency records older than this are deleted by the leader's sweeper.
    idempotency_retention_seconds: float = _setting("idempotency_retention_hours", 3600)
    #: Finished tasks (with their events and leases) older than this are deleted by the
    #: leader's sweeper; 0 keeps them forever.
    finished_retention_seconds: float = _setting("finished_task_retention_hours", 3600)
    #: Each committed pass's inputs and decisions are recorded and kept this long (replay);
    #: 0 records nothing.
    pass_records_seconds: float = _setting("pass_records_seconds")
    #: How often the leader sweeps expired idempotency records and finished tasks.
    sweep_seconds: float = 60.0
    #: Records deleted per sweep transaction.
    sweep_batch: int = 1000
    #: Most sweep transactions in one round, so a large backlog never stalls the loop; the
    #: next round carries on.
    sweep_batches_max: int = 50
    #: Order of the claimed tasks: fifo, priority or fair.
    policy: str = str(_setting("policy"))
    #: Placement strategy: spread or binpack.
    strategy: str = str(_setting("strategy"))
    #: Priority aging: one point per this many seconds waited.
    priority_aging_seconds: float = _setting("priority_aging_seconds")
    #: Ranked candidates kept per decision: the placement, then the alternatives shown in its
    #: JSON and walked to after lost races (keep it above ``reservation_walk_limit``).
    top_k: int = TOP_K_DEFAULT
    #: Grace period of a preemption's victims: their leases are REVOKING this long, and a
    #: completion meanwhile is honoured; then they are revoked and requeued.
    preemption_grace_seconds: float = _setting("preemption_grace_seconds")
    #: A lease younger than this is never a reclaim's victim.
    reclaim_min_runtime_seconds: float = _setting("reclaim_min_runtime_seconds")
    #: A task first of its priority in its runtime class that has not fit for this long is
    #: nominated (0: never; see :mod:`app.scheduling.displacement.nominate`).
    nomination_seconds: float = _setting("nomination_seconds")
    #: Half-life of the decayed usage borrowing tenants are ordered by (0: off).
    fair_usage_half_life_seconds: float = _setting("fair_usage_half_life")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: object) -> ReconcilerConfig:
        """Return the configuration read from ``settings`` (fields in ``overrides`` win)."""
        values: dict[str, object] = {
            "batch_size": settings.batch_size,
            "claim_ttl_seconds": settings.claim_ttl_seconds,
            "lease_ttl_seconds": settings.lease_ttl_seconds,
            "heartbeat_freshness_seconds": settings.heartbeat_freshness_seconds,
            "reservation_walk_limit": settings.reservation_walk_limit,
            "commit_rounds_max": settings.commit_rounds_max,
            "retry_attempts": settings.retry_attempts,
            "retry_base_delay_seconds": settings.retry_base_delay_ms / 1000,
            "tick_seconds": settings.tick_seconds,
            "park_sweep_seconds": settings.park_sweep_seconds,
            "task_events_kept": settings.task_events_kept,
            "policy": str(settings.policy),
            "strategy": str(settings.strategy),
            "priority_aging_seconds": settings.priority_aging_seconds,
            "idempotency_retention_seconds": settings.idempotency_retention_hours * 3600,
            "finished_retention_seconds": settings.finished_task_retention_hours * 3600,
            "pass_records_seconds": settings.pass_records_seconds,
            "preemption_grace_seconds": settings.preemption_grace_seconds,
            "reclaim_min_runtime_seconds": settings.reclaim_min_runtime_seconds,
            "nomination_seconds": settings.nomination_seconds,
            "fair_usage_half_life_seconds": settings.fair_usage_half_life,
            # Enough ranked candidates for every walk the limit allows.
            "top_k": max(TOP_K_DEFAULT, settings.reservation_walk_limit + 1),
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def pass_settings(self) -> PassSettings:
        """Return the settings that decide a pass."""
        return PassSettings(
            top_k=self.top_k, policy=self.policy,
            priority_aging_seconds=self.priority_aging_seconds,
            park_sweep_seconds=self.park_sweep_seconds, task_events_kept=self.task_events_kept,
            preemption_grace_seconds=self.preemption_grace_seconds,
            reclaim_min_runtime_seconds=self.reclaim_min_runtime_seconds,
            nomination_seconds=self.nomination_seconds,
            fair_usage_half_life_seconds=self.fair_usage_half_life_seconds,
        )
