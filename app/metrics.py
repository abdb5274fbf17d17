"""Every Prometheus metric of the scheduler, as module-level constants.

Labels only ever take values from fixed internal sets (outcomes, reason codes, plugin
names, stages, wakeup sources, resources, pool statuses) — never a tenant, task, pool or
label value. The one exception is the quota gauges: their ``tenant`` and
``runtime_class`` labels name only the tenants an admin gave a quota, a set the admin
bounds.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PASS_DURATION = Histogram(
    "berth_pass_duration_seconds",
    "Duration of one reconcile pass (claim, snapshot, select, reserve, lease, commit).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_WAIT = Histogram(
    "berth_queue_wait_seconds",
    "Time from a task's admission to its lease.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
PLACEMENTS = Counter(
    "berth_placements_total",
    "Placement decisions by outcome (leased, pending, conflict).",
    ["outcome"],
)
FILTER_REJECTIONS = Counter(
    "berth_filter_rejections_total",
    "Pools rejected by a filter plugin, by plugin and reason code.",
    ["plugin", "reason"],
)
RESERVATION_CONFLICTS = Counter(
    "berth_reservation_conflicts_total",
    "Reservations that lost a race, by stage (reserve, bind, preempt).",
    ["stage"],
)
PREEMPTIONS = Counter(
    "berth_preemptions_total",
    "Preemptions committed: tasks that displaced lower-priority tasks of their tenant.",
)
#: What became of a preemption's victims: asked to stop (revoking), finished within the
#: grace period (completed), given back by the runtime within it and requeued (released), or
#: revoked at the deadline and requeued (revoked).
PREEMPTION_OUTCOMES = ("revoking", "completed", "released", "revoked")
PREEMPTION_VICTIMS = Counter(
    "berth_preemption_victims_total",
    "Leased tasks displaced by preemptions, by outcome (revoking, completed, released, "
    "revoked).",
    ["outcome"],
)
for _outcome in PREEMPTION_OUTCOMES:
    PREEMPTION_VICTIMS.labels(_outcome)
#: Reclaims of a tenant's nominal within its cohort, by outcome: committed (its victims'
#: leases are revoking), lost at commit (a victim changed meanwhile), or unavailable (no
#: borrowed work of the cohort would make the task fit).
RECLAIM_OUTCOMES = ("started", "conflict", "unavailable")
RECLAIMS = Counter(
    "berth_reclaims_total",
    "Reclaims of a tenant's nominal from borrowers of its cohort, by outcome (started, "
    "conflict, unavailable).",
    ["outcome"],
)
for _outcome in RECLAIM_OUTCOMES:
    RECLAIMS.labels(_outcome)
#: Fair-share reclaims (borrowed work of tenants above their share, for a tenant below it),
#: by outcome: committed, lost at commit, or unfair (no set of victims would leave the
#: reclaimer's share at most the victims').
FAIR_SHARE_RECLAIM_OUTCOMES = ("started", "conflict", "unfair")
FAIR_SHARE_RECLAIMS = Counter(
    "berth_fair_share_reclaims_total",
    "Fair-share reclaims of borrowed capacity from tenants above their share, by outcome "
    "(started, conflict, unfair).",
    ["outcome"],
)
for _outcome in FAIR_SHARE_RECLAIM_OUTCOMES:
    FAIR_SHARE_RECLAIMS.labels(_outcome)
FAIR_SHARE_RECLAIM_VICTIMS = Counter(
    "berth_fair_share_reclaim_victims_total",
    "Borrowed leases revoked by fair-share reclaims.",
)
RECLAIM_VICTIMS = Counter(
    "berth_reclaim_victims_total",
    "Borrowed leases revoked by reclaims (what became of them is counted with the "
    "preemption victims' outcomes).",
)
#: Nominations of starving tasks: started (nominated), and ended by outcome: placed, passed
#: (higher-ranked work needed the capacity), not_first (a waiting task ranks above it now),
#: stale (its pools can no longer let it fit), cancelled or gone (found by the recovery
#: round).
NOMINATION_OUTCOMES = ("nominated", "placed", "passed", "not_first", "stale", "cancelled",
                       "gone")
NOMINATIONS = Counter(
    "berth_nominations_total",
    "Nominations of starving tasks: started (nominated) and ended, by outcome.",
    ["outcome"],
)
for _outcome in NOMINATION_OUTCOMES:
    NOMINATIONS.labels(_outcome)
NOMINATION_HELD = Gauge(
    "berth_nomination_held",
    "Capacity held for nominated tasks, by resource (cpuMillis, memoryMiB, llmSlots); "
    "refreshed by the leader's recovery round.",
    ["resource"],
)
#: How runtimes complete leases: the task finished (succeeded, failed) or was given back
#: unfinished and queued again (released).
LEASE_OUTCOMES = ("succeeded", "failed", "released")
LEASES_COMPLETED = Counter(
    "berth_leases_completed_total",
    "Leases completed by their runtime, by outcome (succeeded, failed, released).",
    ["outcome"],
)
for _outcome in LEASE_OUTCOMES:
    LEASES_COMPLETED.labels(_outcome)
WAKEUPS = Counter(
    "berth_pending_wakeups_total",
    "Wakeups of pending tasks, by source.",
    ["source"],
)
TASKS_CLAIMED = Counter("berth_tasks_claimed_total", "Tasks claimed by reconcile passes.")
TASKS_LEASED = Counter("berth_tasks_leased_total", "Tasks reserved and leased.")
LEASES_EXPIRED = Counter(
    "berth_leases_expired_total",
    "Leases recovered, by cause (expired, revoked by a drain deadline).",
    ["cause"],
)
IDEMPOTENCY_RECORDS_EXPIRED = Counter(
    "berth_idempotency_records_expired_total",
    "Idempotency records deleted by the sweeper after BERTH_IDEMPOTENCY_RETENTION_HOURS.",
)
PASS_RECORDS_PRUNED = Counter(
    "berth_pass_records_pruned_total",
    "Recorded passes deleted after BERTH_PASS_RECORDS_SECONDS.",
)
TASKS_PRUNED = Counter(
    "berth_tasks_pruned_total",
    "Finished tasks deleted (with their events and leases) after "
    "BERTH_FINISHED_TASK_RETENTION_HOURS.",
)
TRANSIENT_RETRIES = Counter(
    "berth_transient_retries_total",
    "Transaction retries after a transient failure, by kind.",
    ["kind"],
)
SHARDS_OWNED = Gauge("berth_shards_owned", "Shard slots owned by this reconciler process.")
#: Pending codes a waiting task may carry besides the scheduling core's reason codes; any
#: other stored value is counted as ``other``.
PENDING_EXTRA_CODES = ("unexamined", "reservation_conflict", "invalid_spec", "scheduler_error",
                       "preempting", "reclaiming", "nominated", "other")
TASKS_PENDING = Gauge(
    "berth_tasks_pending",
    "Waiting tasks (ADMITTED or CLAIMED) of the owned slots, by pending reason code "
    "(the closest miss; unexamined before the first pass).",
    ["reason"],
)
TASKS_PARKED = Gauge(
    "berth_tasks_parked", "Parked tasks of the owned slots (waiting for a wakeup that could help)."
)
TASKS_REEXAMINED = Counter(
    "berth_tasks_reexamined_total",
    "Woken parked tasks claimed again to be re-examined (not counted as claims).",
)

#: Why a request was refused before Berth worked on it (see app/api/shedding.py and
#: app/api/timeouts.py); every reason is counted from zero so that rates read well.
SHED_REASONS = ("in_flight_limit", "rate_limit", "header_timeout", "header_too_large",
                "body_timeout", "invalid_key_limit", "unauthenticated_limit", "compute_bound")
REQUESTS_SHED = Counter(
    "berth_http_requests_shed_total",
    "HTTP requests refused to protect the process, by reason.",
    ["reason"],
)
for _reason in SHED_REASONS:
    REQUESTS_SHED.labels(_reason)

#: How late the API process's event loop ran a timer: how long something else held the loop
#: (or the machine left the process waiting for a core). Sampled by
#: :func:`app.services.offload.loop_lag_watch`.
PREVIEW_ROWS_READ = Histogram(
    "berth_preview_rows_read",
    "Rows a preview's snapshot refresh read: the pool, ledger and runtime instance rows "
    "written since its worker's previous read, or every pool when read whole.",
    buckets=(0, 10, 100, 1000, 10_000, 100_000),
)
LOOP_LAG = Histogram(
    "berth_event_loop_lag_seconds",
    "How late the API process's event loop woke a timer due now (sampled every 25 ms).",
    buckets=(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
             0.15, 0.25, 0.5, 1.0, 2.5, 5.0),
)

#: Requests answered 503 because the database was unreachable or asked for a retry.
DATABASE_UNAVAILABLE = Counter(
    "berth_http_database_unavailable_total",
    "HTTP requests answered 503 because the database was unavailable or busy.",
)

#: The resources of a ledger, as the capacity gauges name them, and the pool statuses.
RESOURCES = ("cpu_millis", "memory_mib", "llm_slots")
POOL_STATUSES = ("ACTIVE", "CORDONED", "DRAINING")
POOL_CAPACITY = Gauge(
    "berth_pool_capacity",
    "Ledger totals summed over the pools in each status (every reconciler reports the "
    "whole cluster: aggregate with max, not sum).",
    ["resource", "status"],
)
POOL_RESERVED = Gauge(
    "berth_pool_reserved",
    "Reserved capacity summed over the pools in each status (every reconciler reports the "
    "whole cluster: aggregate with max, not sum).",
    ["resource", "status"],
)
for _resource in RESOURCES:
    for _status in POOL_STATUSES:
        POOL_CAPACITY.labels(_resource, _status)
        POOL_RESERVED.labels(_resource, _status)

#: Why the front door answered 401 (app/api/front_door.py): no bearer key, a key the database
#: did not know, or a key that failed verification moments before (answered without a query).
UNAUTHENTICATED_REASONS = ("no_key", "invalid_key", "refused_key")
REQUESTS_UNAUTHENTICATED = Counter(
    "berth_http_requests_unauthenticated_total",
    "HTTP requests answered 401 before their body was read, by reason.",
    ["reason"],
)
for _reason in UNAUTHENTICATED_REASONS:
    REQUESTS_UNAUTHENTICATED.labels(_reason)

#: Quota gauges, per tenant with a quota, runtime class and resource (cpuMillis, memoryMiB,
#: llmSlots); each reconciler reports the tenants of the shard slots it owns.
_QUOTA_LABELS = ["tenant", "runtime_class", "resource"]
QUOTA_NOMINAL = Gauge("berth_quota_nominal", "A tenant's nominal quota.", _QUOTA_LABELS)
QUOTA_USED = Gauge(
    "berth_quota_used", "What a tenant's live leases use of a quota'd resource.", _QUOTA_LABELS
)
QUOTA_BORROWED = Gauge(
    "berth_quota_borrowed", "What of a tenant's usage is above its nominal.", _QUOTA_LABELS
)
#: Cohort gauges, per cohort of the quota tree (set by an admin or named by a tenant: a
#: bounded set), runtime class and resource; the reconciler owning the cohort id's shard
#: slot reports it.
_COHORT_LABELS = ["cohort", "runtime_class", "resource"]
COHORT_CAP = Gauge(
    "berth_cohort_cap", "A cohort's cap: its nominal plus what its members lend it.",
    _COHORT_LABELS,
)
COHORT_USED = Gauge("berth_cohort_used", "What a cohort's members draw on it.", _COHORT_LABELS)
COHORT_BORROWED = Gauge(
    "berth_cohort_borrowed", "What a cohort draws above its cap (borrowed from its parent).",
    _COHORT_LABELS,
)
