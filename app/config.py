"""One settings class for the whole service; every field reads from a ``BERTH_`` variable.

Durations carry their unit in the name (``_seconds``, ``_ms``) so that nobody has to guess.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Fixed number of shard slots. A tenant's slot is a stable hash of its id over this count.
#: It is a constant, not a setting: changing it would move tenants between slots while
#: tasks are queued, so every reconciler and API replica must agree on it forever.
SHARD_SLOTS = 64


class Policy(StrEnum):
    """Order in which the claimed tasks of one pass are considered."""

    FIFO = "fifo"
    PRIORITY = "priority"
    FAIR = "fair"


class Strategy(StrEnum):
    """Placement strategy: spread work over the least loaded pools, or pack the fullest."""

    SPREAD = "spread"
    BINPACK = "binpack"


class Settings(BaseSettings):
    """Berth configuration, read from ``BERTH_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="BERTH_", extra="ignore")

    # --- database -------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL (postgresql://user:pass@host:port/db), or several hosts "
        "(postgresql://user:pass@h1:5432,h2:5432/db?target_session_attrs=read-write). Unset: "
        "an embedded PostgreSQL is started in data_dir.",
    )
    data_dir: Path = Field(
        default=Path(".berth"),
        description="Directory of the embedded PostgreSQL (used only without database_url).",
    )
    db_pool_size: int = Field(
        default=20, ge=1, description="Most database connections one process opens (asyncpg pool)."
    )
    db_connect_timeout_seconds: float = Field(default=5.0, gt=0)
    db_pool_wait_seconds: float = Field(
        default=0.5,
        gt=0,
        description="Longest an API request waits for a database connection while all are "
        "busy; then it, and every request after it until one is free again, is answered 503 "
        "with Retry-After at once.",
    )

    # --- HTTP -----------------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Address `berth serve` listens on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port `berth serve` listens on.")
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, description="Larger bodies: 413.")
    max_batch_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Larger bodies of POST /v1/task-batches (up to 1,000 specs): 413.",
    )
    max_in_flight_requests: int = Field(
        default=256,
        ge=1,
        description="Requests one process works on at once; past it a request is answered "
        "503 with Retry-After at once. /healthz, /readyz, /metrics and watches (/v1/watch, "
        "bounded by watch_max_watchers) are exempt.",
    )
    watch_max_watchers: int = Field(
        default=10_000,
        ge=1,
        description="Watch connections (GET /v1/watch) one process serves at once; past it a "
        "new one is answered 429 with Retry-After. Watches do not count against "
        "max_in_flight_requests.",
    )
    watch_max_watchers_per_key: int = Field(
        default=1_000,
        ge=1,
        description="Watch connections one API key may hold open on one process at once; "
        "past it 429 with Retry-After.",
    )
    watch_heartbeat_seconds: float = Field(
        default=10.0,
        gt=0,
        le=15,
        description="A watch stream with nothing to send sends a heartbeat comment (and a "
        "bookmark when its cursor moved) this often.",
    )
    watch_buffer_batches: int = Field(
        default=64,
        ge=1,
        description="Batches of events buffered per watcher; a watcher that falls further "
        "behind reads the event log again from its own cursor.",
    )
    rate_limit_requests_per_second: float = Field(
        default=0.0,
        ge=0,
        description="Sustained requests per second one API key may send to one process "
        "(a token bucket); more is 429 with Retry-After. 0 turns the limit off.",
    )
    rate_limit_burst_requests: int = Field(
        default=100,
        ge=1,
        description="Token bucket size: requests a key may send at once above the sustained "
        "rate (only with rate_limit_requests_per_second).",
    )
    max_unauthenticated_requests: int = Field(
        default=16,
        ge=1,
        description="API keys one process looks up in the database at once (requests not yet "
        "authenticated); past it a request whose key is not cached is answered 503 with "
        "Retry-After at once.",
    )
    invalid_keys_per_second: float = Field(
        default=5.0,
        gt=0,
        description="Sustained API keys per second that may fail verification from one client "
        "address (a token bucket); past it, keys this process has not verified before are "
        "answered 429 with Retry-After without a database look-up.",
    )
    invalid_key_burst_requests: int = Field(
        default=50,
        ge=1,
        description="Token bucket size: invalid API keys one client address may send at once "
        "above invalid_keys_per_second.",
    )
    request_header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="`berth serve` closes a connection whose request line and headers are "
        "not complete this long after the connection (or its previous request) began.",
    )
    request_body_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A request body not received in full this long after its headers is "
        "answered 408 and the connection closed.",
    )
    max_queued_tasks_per_tenant: int = Field(
        default=100_000,
        ge=0,
        description="Queued (ADMITTED) tasks one tenant may have; past it createTask answers "
        "429 with Retry-After. Under concurrent submissions of one tenant it may be exceeded "
        "by at most the submissions in flight at that moment (docs/api.md). 0 turns it off.",
    )
    idempotency_retention_hours: float = Field(
        default=24.0,
        gt=0,
        description="How long an Idempotency-Key's stored answer is replayed; older records "
        "are deleted by the reconciler leader's sweeper.",
    )
    finished_task_retention_hours: float = Field(
        default=168.0,
        ge=0,
        description="How long a finished task (succeeded, failed, cancelled) is kept, with "
        "its events and leases, after it finished; older ones are deleted by the reconciler "
        "leader's sweeper, and GET /v1/tasks/{id} answers 404 for them. A task's "
        "Idempotency-Key deduplicates as long as the task is kept, so this must be at least "
        "idempotency_retention_hours. 0 keeps finished tasks forever.",
    )
    preview_workers: int = Field(
        default=2,
        ge=0,
        description="Worker processes of one API process that compute previews (placement "
        "and drain previews decide and build their answer there, off the event loop); 0 "
        "computes them in one thread of the API process instead.",
    )
    preview_max_concurrent: int = Field(
        default=8,
        ge=1,
        description="Previews one API process computes or holds waiting for a worker at "
        "once; past it a preview is answered 429 with Retry-After at once.",
    )
    preview_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A preview not computed this long after it was asked for is answered "
        "503 with Retry-After.",
    )
    pass_records_seconds: float = Field(
        default=900.0,
        ge=0,
        description="How long each committed reconcile pass's recorded inputs and decisions "
        "are kept for `berth replay` and POST /v1/replays; older ones are deleted by the "
        "reconciler leader's sweeper. 0 records nothing.",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error.")
    bootstrap_admin_key_file: Path | None = Field(
        default=None,
        description="File holding the bootstrap admin API key (e.g. a mounted Kubernetes "
        "Secret): `berth serve` stores its hash on a database without one and prints no key. "
        "Unset: a key is generated and printed once.",
    )

    # --- scheduling -----------------------------------------------------------------------
    policy: Policy = Field(default=Policy.FIFO, description="fifo, priority or fair.")
    strategy: Strategy = Field(default=Strategy.SPREAD, description="spread or binpack.")
    priority_aging_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Under the priority policy a waiting task gains one priority point per "
        "this many seconds, so nothing starves.",
    )
    heartbeat_freshness_seconds: float = Field(
        default=15.0, gt=0, description="A runtime is healthy while its last heartbeat is newer."
    )
    queue_count_limit: int = Field(
        default=10000,
        ge=1,
        description="Most competing tasks of a runtime class read for queue positions; past "
        "it `queue.position` and `queue.competing` are lower bounds (`queue.exact` false).",
    )
    queue_snapshot_seconds: float = Field(
        default=1.0,
        ge=0,
        description="An API process reads a runtime class's competing queue at most this "
        "often for getTask's queue positions (positions may be this old).",
    )
    eta_window_seconds: float = Field(
        default=900.0,
        gt=0,
        description="Window over which lease completions on a task's candidate pools are "
        "counted for its estimated start time: the simulated lease ends are spaced at that "
        "rate.",
    )
    eta_leases_max: int = Field(
        default=32,
        ge=1,
        le=10000,
        description="Most live leases an estimated start lets end (oldest first, the planner "
        "planning again after each); a task the planner does not place by then gets no "
        "estimate.",
    )
    eta_tasks_max: int = Field(
        default=50,
        ge=1,
        le=10000,
        description="Most competing tasks an estimated start plans ahead of the task; a task "
        "with more ahead of it gets no estimate.",
    )
    preemption_grace_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Grace period of a preemption's victims: their leases are REVOKING this "
        "long (a completion meanwhile is honoured), then revoked and their tasks requeued.",
    )
    reclaim_min_runtime_seconds: float = Field(
        default=0.0,
        ge=0,
        description="A lease younger than this is never reclaimed: a tenant back under its "
        "nominal takes back only borrowed work that has run at least this long.",
    )
    fair_usage_half_life: float = Field(
        default=0.0,
        ge=0,
        le=365 * 86400,
        description="Seconds: half-life of the decayed usage that orders tenants which borrow "
        "within a runtime class (a tenant that consumed more recently waits behind one that "
        "did not; 0: off, they are ordered by their share of borrowed capacity now).",
    )
    nomination_seconds: float = Field(
        default=300.0,
        ge=0,
        description="A task first of its priority in its runtime class that has not fit for "
        "this long is nominated: capacity freed on the pools it would take is held for it "
        "until it fits (0: never).",
    )

    # --- reconciler -----------------------------------------------------------------------
    reconciler_enabled: bool = Field(
        default=True, description="Run a reconciler inside `berth serve`."
    )
    batch_size: int = Field(default=1024, ge=1, le=5000, description="Tasks claimed per pass.")
    claim_ttl_seconds: float = Field(
        default=30.0, gt=0,
        description="Longest a reconcile pass may sit idle in its transaction holding its "
        "claims (row locks) before the server ends its session and the claims return.",
    )
    lease_ttl_seconds: float = Field(
        default=60.0, gt=0, description="Lease expiry; each heartbeat renews it."
    )
    reservation_walk_limit: int = Field(
        default=3, ge=0, description="Next-ranked candidates tried after a lost reservation."
    )
    commit_rounds_max: int = Field(
        default=4,
        ge=1,
        description="Commit rounds of a reconciler pass that may reserve capacity; when the "
        "last one still loses a race, the placements left go back to the queue.",
    )
    retry_attempts: int = Field(default=5, ge=1, description="Tries of a transient DB failure.")
    retry_base_delay_ms: float = Field(default=20.0, gt=0, description="First retry backoff.")
    tick_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Period of a reconciler pass without any wakeup (re-takes expired "
        "claims; unparks nothing).",
    )
    park_sweep_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Safety sweep: every parked task is re-examined about this often "
        "(jittered by ±25 %), in case a wakeup was missed; a task still pending for the same "
        "reason writes no event, and a parked task logs at most one change of its pending "
        "reason per this period (its pendingReason is always the latest).",
    )
    task_events_kept: int = Field(
        default=100,
        ge=1,
        description="Events a task that never finishes keeps besides its first: past this "
        "many pending-reason events, each new one deletes its oldest events but the first.",
    )
    reconciler_metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port on which `berth reconcile` serves /metrics; unset: none.",
    )
    shard: str | None = Field(
        default=None,
        description="Static shard ownership INDEX/COUNT; unset = dynamic via advisory locks.",
    )

    @field_validator("finished_task_retention_hours")
    @classmethod
    def _retention_covers_idempotency(cls, value: float, info: ValidationInfo) -> float:
        keys = info.data.get("idempotency_retention_hours")
        if value and keys is not None and value < keys:
            raise ValueError(
                f"must be 0 (keep forever) or at least BERTH_IDEMPOTENCY_RETENTION_HOURS "
                f"({keys:g}): a task's Idempotency-Key is honoured only while the task is kept"
            )
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level_known(cls, value: str) -> str:
        value = value.lower()
        if value not in {"debug", "info", "warning", "error", "critical"}:
            raise ValueError("must be one of debug, info, warning, error, critical")
        return value


@lru_cache
def get_settings() -> Settings:
    """Return the process-wide settings, read once from the environment."""
    return Settings()
