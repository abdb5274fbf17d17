"""The durable schema as SQLAlchemy Core tables.

The Alembic revisions under ``migrations/`` create this schema; a test proves that running
every migration gives exactly these tables. Queries in :mod:`app.ledger` are written against
these objects (or as named SQL beside them). Invariants the database itself enforces:

* ``ledgers``: ``0 <= reserved <= total`` on every dimension (over-commit is impossible,
  even for buggy code);
* ``tasks.state`` and ``pools.status`` take only their legal values;
* one task per (tenant, idempotency key); one reservation row per (task, pool); at most one
  active lease per (task, pool).

The high-volume tables (``reservations``, ``leases``, ``task_events``) carry no foreign keys
(revision 0008_pass): docs/decisions/0007-no-foreign-keys-on-hot-tables.md says what keeps
their references valid instead.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB, UUID

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

#: A task being scheduled is ADMITTED and row-locked by its pass: CLAIMED is not stored
#: (revision 0008_pass, docs/decisions/0006-claims-are-row-locks.md).
TASK_STATES = ("ADMITTED", "LEASED", "SUCCEEDED", "FAILED", "CANCELLED")
POOL_STATUSES = ("ACTIVE", "CORDONED", "DRAINING")
LEASE_STATES = ("ACTIVE", "REVOKING", "COMPLETED", "EXPIRED", "REVOKED", "CANCELLED")
#: Lease states in which the runtime holds the lease (REVOKING: asked to stop by a deadline).
LIVE_LEASE = "state IN ('ACTIVE', 'REVOKING')"
ROLES = ("admin", "operator", "tenant", "runtime")


def _in(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


NOW = text("now()")
#: The writing transaction's id as a bigint (``xid8`` has no BRIN operator class).
XID = "(pg_current_xact_id()::text)::bigint"

#: Tenant, pool and runtime-instance ids: machine identifiers compared bytewise, whatever the
#: server's locale (revision 0014_keys_collate_c, decision 14).
ID = Text(collation="C")

pools = Table(
    "pools",
    metadata,
    Column("id", ID, primary_key=True),
    Column("tenant_ids", ARRAY(Text), nullable=False, server_default="{}"),
    Column("runtime_class", Text, nullable=False),
    Column("runtime_instance_id", ID, nullable=False),
    Column("region", Text, nullable=False),
    Column("data_residency", Text, nullable=False, server_default=""),
    Column("failure_domain", Text, nullable=False, server_default=""),
    Column("labels", JSONB, nullable=False, server_default="{}"),
    Column("artifact_regions", ARRAY(Text), nullable=False, server_default="{}"),
    Column("cost_weight", Float, nullable=False, server_default="1"),
    Column("operators", ARRAY(Text), nullable=False, server_default="{}"),
    Column("status", Text, nullable=False, server_default="ACTIVE"),
    Column("status_reason", Text),
    Column("drain_deadline", DateTime(timezone=True)),
    Column("ready", Boolean, nullable=False, server_default="true"),
    Column("version", BigInteger, nullable=False, server_default="1"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint(_in("status", POOL_STATUSES), name="status_legal"),
    CheckConstraint("cost_weight >= 0", name="cost_weight_nonnegative"),
    CheckConstraint("id ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'", name="id_slug"),
    CheckConstraint("version >= 1", name="version_positive"),
)
Index("ix_pools_runtime_instance_id", pools.c.runtime_instance_id)

ledgers = Table(
    "ledgers",
    metadata,
    Column("pool_id", ID, ForeignKey("pools.id", ondelete="CASCADE"), primary_key=True),
    Column("cpu_total", BigInteger, nullable=False),
    Column("memory_total", BigInteger, nullable=False),
    Column("llm_total", BigInteger, nullable=False),
    Column("cpu_reserved", BigInteger, nullable=False, server_default="0"),
    Column("memory_reserved", BigInteger, nullable=False, server_default="0"),
    Column("llm_reserved", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint("cpu_reserved >= 0 AND cpu_reserved <= cpu_total", name="cpu_within_total"),
    CheckConstraint(
        "memory_reserved >= 0 AND memory_reserved <= memory_total", name="memory_within_total"
    ),
    CheckConstraint("llm_reserved >= 0 AND llm_reserved <= llm_total", name="llm_within_total"),
    # Every pass updates the rows of the pools it placed on: half of each page stays free so
    # that the new row version fits beside the old one (a HOT update, no index entry)
    # (revision 0010_pg).
    postgresql_with={"fillfactor": 50},
)

runtime_instances = Table(
    "runtime_instances",
    metadata,
    Column("id", ID, primary_key=True),
    Column("last_heartbeat_at", DateTime(timezone=True), nullable=False),
    Column("first_seen_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

tasks = Table(
    "tasks",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    # Admission order: the fifo key, the cursor of lists, the tie-break of every policy.
    # Unique by its identity, without an index of its own (revision 0009_batch, decision 8).
    Column("seq", BigInteger, Identity(always=True), nullable=False),
    Column("tenant_id", ID, nullable=False),
    Column("shard", Integer, nullable=False),
    Column("state", Text, nullable=False, server_default="ADMITTED"),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("runtime_class", Text, nullable=False),
    # The validated spec as the API wrote it, ``json`` (not ``jsonb``): every claim reads it
    # as text, which ``json`` returns as stored instead of rebuilding it from a binary
    # document (revision 0013_spec_json, decision 13).
    Column("spec", JSON, nullable=False),
    Column("labels", JSONB, nullable=False, server_default="{}"),
    Column("pending_reason", JSONB),
    # A parked task is ADMITTED but waits for a wakeup (capacity released, pool activated...)
    # instead of being claimed again in a hot loop.
    Column("parked", Boolean, nullable=False, server_default="false"),
    # What could let a parked task fit: keys a wakeup carries (``app.scheduling.parking``).
    Column("wake", ARRAY(Text)),
    # The stage (reasons.Stage) of the pending reason's closest miss (NULL: not examined yet).
    Column("pending_stage", SmallInteger),
    # The pending code the task's event log last recorded, and when (revision
    # 0015_tokens_coalescing): a re-examined task's reason changes are logged at most once
    # per park sweep period, the latest caught up later (``app.reconciler.passes``).
    Column("logged_code", Text),
    Column("logged_at", DateTime(timezone=True)),
    # Pending-reason events the task logged: past the kept count, each new one trims the log
    # to its first event and its latest ones (``app.ledger.retention.task_events_trim``).
    Column("logged_count", Integer, nullable=False, server_default="0"),
    # Written once per lease and read whole, never searched: the JSON text the reconciler
    # wrote with orjson, in one versioned format (app.scheduling.explain, decision 20),
    # stored as ``text`` (not parsed again at every lease; decision 11).
    Column("placement", Text),
    Column("attempts", Integer, nullable=False, server_default="0"),
    # Times the task was displaced by a preemptor (revision 0006_preemption): it uses no
    # attempt, but its next lease's fencing epoch must still be higher.
    Column("preemptions", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False, server_default="3"),
    Column("idempotency_key", Text),
    Column("request_hash", Text),
    Column("failure_reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("admitted_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("leased_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint(_in("state", TASK_STATES), name="state_legal"),
    CheckConstraint("shard >= 0", name="shard_nonnegative"),
    CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
    CheckConstraint("preemptions >= 0", name="preemptions_nonnegative"),
    CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
)
# Idempotency keys are unique per tenant; only keyed tasks are indexed (revision 0003).
Index(
    "uq_tasks_tenant_idempotency_key",
    tasks.c.tenant_id,
    tasks.c.idempotency_key,
    unique=True,
    postgresql_where=text("idempotency_key IS NOT NULL"),
)
# Oldest claimable tasks of a reconciler's slots, in admission order (revision 0002; the
# per-slot (shard, seq) index is gone since 0009_batch: this one and the next serve its reads).
Index(
    "ix_tasks_claim_order", tasks.c.seq, postgresql_where=text("state = 'ADMITTED' AND NOT parked")
)
# A tenant's claimable queue within its slot: the fair claim's per-tenant reads (revision 0002).
Index(
    "ix_tasks_claim_tenant",
    tasks.c.shard,
    tasks.c.tenant_id,
    tasks.c.seq,
    postgresql_where=text("state = 'ADMITTED' AND NOT parked"),
)
# Parked tasks woken by an event.
Index("ix_tasks_parked", tasks.c.shard, postgresql_where=text("state = 'ADMITTED' AND parked"))
# Wakeups: the parked tasks whose wake keys overlap an event's (revision 0004_parking).
Index(
    "ix_tasks_parked_wake", tasks.c.wake, postgresql_using="gin",
    postgresql_where=text("state = 'ADMITTED' AND parked"),
)
# The competing queue of a runtime class: tasks waiting that released capacity could help
# (not those a pool must first be added, activated or changed for). Queue positions read
# one bounded range of it instead of scanning the queue (revision 0004_parking).
COMPETING = (
    "state IN ('ADMITTED', 'CLAIMED') AND (pending_stage IS NULL OR pending_stage >= 4)"
)
Index("ix_tasks_queue_seq", tasks.c.runtime_class, tasks.c.seq, postgresql_where=text(COMPETING))
# A tenant's own tasks, newest first / by cursor.
Index("ix_tasks_tenant_seq", tasks.c.tenant_id, tasks.c.seq)
FINISHED = "state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
# The leased tasks of a few tenants: affinity counts, preemption victims (0007_history).
Index("ix_tasks_leased_tenant", tasks.c.tenant_id, postgresql_where=text("state = 'LEASED'"))
# Finished tasks by finish time: the retention sweep's range (0007_history).
Index("ix_tasks_finished", tasks.c.finished_at, postgresql_where=text(FINISHED))

reservations = Table(
    "reservations",
    metadata,
    Column("task_id", UUID(as_uuid=True), nullable=False),
    Column("pool_id", ID, nullable=False),
    Column("members", Integer, nullable=False, server_default="1"),
    Column("cpu", BigInteger, nullable=False),
    Column("memory", BigInteger, nullable=False),
    Column("llm", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # A preemptor's hold (capacity kept for an admitted task), not a lease's reservation
    # (revision 0010_pg).
    Column("hold", Boolean, nullable=False, server_default="false"),
    PrimaryKeyConstraint("task_id", "pool_id", name="pk_reservations"),
    CheckConstraint("members >= 1", name="members_positive"),
    CheckConstraint("cpu >= 0 AND memory >= 0 AND llm >= 0", name="amounts_nonnegative"),
)
# A pool's reservations are its live leases' (found through ``ix_leases_pool_live`` and the
# primary key) and its holds: only holds are indexed by pool, so that a placement's
# reservation writes one index entry, not two (revision 0010_pg).
Index("ix_reservations_pool_hold", reservations.c.pool_id, postgresql_where=text("hold"))

leases = Table(
    "leases",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("task_id", UUID(as_uuid=True), nullable=False),
    Column("pool_id", ID, nullable=False),
    Column("runtime_instance_id", ID, nullable=False),
    # Fencing epoch: every write for a lease names it; a recovered and re-granted task has a
    # higher epoch, so a stale runtime's completion is refused.
    Column("epoch", BigInteger, nullable=False),
    Column("state", Text, nullable=False, server_default="ACTIVE"),
    Column("granted_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    Column("end_reason", Text),
    # Set when the lease goes REVOKING (revision 0006_preemption): the runtime should stop by
    # ``revoke_by``; ``preempted_by`` is the task the lease's capacity is handed over to.
    Column("revoke_by", DateTime(timezone=True)),
    Column("preempted_by", UUID(as_uuid=True)),
    CheckConstraint(_in("state", LEASE_STATES), name="state_legal"),
    CheckConstraint("epoch >= 1", name="epoch_positive"),
    CheckConstraint("state <> 'REVOKING' OR revoke_by IS NOT NULL", name="revoking_has_deadline"),
)
# At most one live lease per (task, pool); live = ACTIVE or REVOKING (revision 0006).
Index(
    "ix_leases_live_task_pool",
    leases.c.task_id,
    leases.c.pool_id,
    unique=True,
    postgresql_where=text(LIVE_LEASE),
)
# The ended leases of a task: the retention sweep deletes a pruned task's leases
# (0007_history). Partial, so that a placement (which inserts a live lease) writes no entry.
Index("ix_leases_task_id", leases.c.task_id, postgresql_where=text(f"NOT ({LIVE_LEASE})"))
# A runtime's live leases (heartbeats, its lease list), and the expired ones (recovery reads
# it whole, testing the expiry on each entry): one index for both, so a lease and each of its
# renewals write one entry for them (0024_lease_expiry_by_instance).
Index(
    "ix_leases_instance_expiry",
    leases.c.runtime_instance_id,
    leases.c.expires_at,
    postgresql_where=text(LIVE_LEASE),
)
Index("ix_leases_pool_live", leases.c.pool_id, postgresql_where=text(LIVE_LEASE))
# Revoking leases past their deadline (the leader revokes them), and per preemptor.
Index("ix_leases_revoke_by", leases.c.revoke_by, postgresql_where=text("state = 'REVOKING'"))
Index(
    "ix_leases_preempted_by", leases.c.preempted_by, postgresql_where=text("state = 'REVOKING'")
)
# Recent completions per pool: the observed rate behind a queued task's ETA (0004_parking).
Index(
    "ix_leases_pool_completed", leases.c.pool_id, leases.c.ended_at,
    postgresql_where=text("state = 'COMPLETED'"),
)

task_events = Table(
    "task_events",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("task_id", UUID(as_uuid=True), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("from_state", Text),
    Column("to_state", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", JSONB),
    # The writing transaction's top-level id (revision 0019_watch_feed): the watch feed
    # delivers an event once that transaction is visible to its snapshot (app.ledger.watch).
    Column("xid", BigInteger, nullable=False, server_default=text(XID)),
    # Events are read by task (a task's trail, retention, the undo of a lost race); ``id``
    # is unique by its identity, so one index serves both (0011_events).
    PrimaryKeyConstraint("task_id", "id", name="pk_task_events"),
)
# The watch feed reads recent ranges of ids and of transaction ids: a BRIN summary, which a
# placement's event does not pay an index entry for (0019_watch_feed).
Index(
    "ix_task_events_id_xid", task_events.c.id, task_events.c.xid, postgresql_using="brin",
    postgresql_with={"pages_per_range": 16, "autosummarize": "on"},
)

# A pool's changes for the watch feed (0019_watch_feed), written by the trigger
# ``pools_log``: ``kind`` is created, updated, active, cordoned, draining or deleted. Ids come
# from the sequence of ``task_events.id``: the feed reads both logs in one order.
pool_events = Table(
    "pool_events",
    metadata,
    Column("id", BigInteger, nullable=False,
           server_default=text("nextval('task_events_id_seq'::regclass)")),
    Column("xid", BigInteger, nullable=False, server_default=text(XID)),
    Column("pool_id", ID, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("kind", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("runtime_class", Text, nullable=False),
    Column("operators", ARRAY(Text), nullable=False),
    PrimaryKeyConstraint("id", name="pk_pool_events"),
)
Index("ix_pool_events_xid", pool_events.c.xid)
Index("ix_pool_events_at", pool_events.c.at)

# Secrets the server generates once and every process shares (revision
# 0015_tokens_coalescing): ``tokens`` seals list cursors and event ids (app.services.tokens).
server_secrets = Table(
    "server_secrets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("secret", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    # sha256 of the key; the key itself is never stored.
    Column("key_hash", Text, nullable=False, unique=True),
    Column("prefix", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("tenant_ids", ARRAY(Text), nullable=False, server_default="{}"),
    Column("runtime_instance_ids", ARRAY(Text), nullable=False, server_default="{}"),
    Column("bootstrap", Boolean, nullable=False, server_default="false"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("revoked_at", DateTime(timezone=True)),
    # Recorded at most once a minute per key (revision 0005), not on every request.
    Column("last_used_at", DateTime(timezone=True)),
    CheckConstraint(_in("role", ROLES), name="role_legal"),
)
Index("ix_api_keys_prefix", api_keys.c.prefix)
# At most one bootstrap key, ever: the "printed once" guarantee is enforced by the database.
Index("ix_api_keys_bootstrap", api_keys.c.bootstrap, unique=True,
      postgresql_where=text("bootstrap"))

# One record per (API key, operation, Idempotency-Key) (revision 0005): two keys of one
# subject never replay each other's answers. Records older than the retention are swept.
idempotency_records = Table(
    "idempotency_records",
    metadata,
    Column("key_id", UUID(as_uuid=True), nullable=False),
    Column("key", Text, nullable=False),
    Column("operation", Text, nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("response", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    PrimaryKeyConstraint("key_id", "operation", "key", name="pk_idempotency_records"),
)
Index("ix_idempotency_records_created_at", idempotency_records.c.created_at)

# Queued (ADMITTED or CLAIMED) tasks per tenant, in stripes summed by createTask to enforce
# the per-tenant cap; statement triggers on ``tasks`` keep it exact (revision 0005).
tenant_queue_counts = Table(
    "tenant_queue_counts",
    metadata,
    Column("tenant_id", ID, nullable=False),
    Column("stripe", SmallInteger, nullable=False),
    Column("queued", BigInteger, nullable=False),
    PrimaryKeyConstraint("tenant_id", "stripe", name="pk_tenant_queue_counts"),
)

# Tenants an admin configured: cohort and fair weight (revision 0017_tenant_quotas). A tenant
# without a row has the defaults (cohort ``default``, weight 1, no quota).
tenants = Table(
    "tenants",
    metadata,
    Column("id", ID, nullable=False),
    Column("cohort", ID, nullable=False, server_default="default"),
    Column("fair_weight", Float, nullable=False, server_default="1"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    PrimaryKeyConstraint("id", name="pk_tenants"),
    CheckConstraint("fair_weight > 0", name="fair_weight_positive"),
)
Index("ix_tenants_cohort", tenants.c.cohort)

# A tenant's quota per runtime class and resource: nominal (guaranteed), the most it may
# borrow above it (NULL: no limit but the cohort's) and the most of its unused nominal others
# may borrow (NULL: all of it). A resource without a row is not limited.
tenant_quotas = Table(
    "tenant_quotas",
    metadata,
    Column("tenant_id", ID, ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
    Column("runtime_class", ID, nullable=False),
    Column("resource", Text, nullable=False),
    Column("nominal", BigInteger, nullable=False),
    Column("borrowing_limit", BigInteger),
    Column("lending_limit", BigInteger),
    PrimaryKeyConstraint("tenant_id", "runtime_class", "resource", name="pk_tenant_quotas"),
    CheckConstraint(
        "resource IN ('cpuMillis', 'memoryMiB', 'llmSlots')", name="resource_known"
    ),
    CheckConstraint(
        "nominal >= 0 AND (borrowing_limit IS NULL OR borrowing_limit >= 0) "
        "AND (lending_limit IS NULL OR lending_limit BETWEEN 0 AND nominal)",
        name="amounts_valid",
    ),
)
Index("ix_tenant_quotas_runtime_class", tenant_quotas.c.runtime_class)

# What each tenant uses of each managed (runtime class, resource) — one that some tenant's
# quota names — with its quota copied in: ``cap`` = nominal + borrowing limit (NULL: only the
# cohort limits it), ``lend`` = what of its unused nominal others may borrow (NULL: all).
# Placements raise ``used`` by a conditional update in their pass's transaction, every path
# that ends a lease lowers it in the same transaction (revision 0017_tenant_quotas).
quota_usage = Table(
    "quota_usage",
    metadata,
    Column("tenant_id", ID, nullable=False),
    Column("runtime_class", ID, nullable=False),
    Column("resource", Text, nullable=False),
    Column("cohort", ID, nullable=False),
    Column("nominal", BigInteger, nullable=False),
    Column("cap", BigInteger),
    Column("lend", BigInteger),
    Column("used", BigInteger, nullable=False, server_default="0"),
    PrimaryKeyConstraint("tenant_id", "runtime_class", "resource", name="pk_quota_usage"),
    CheckConstraint("used >= 0 AND nominal >= 0", name="used_nonnegative"),
    CheckConstraint("cap IS NULL OR used <= cap", name="used_within_cap"),
)
Index("ix_quota_usage_cohort", quota_usage.c.cohort, quota_usage.c.runtime_class)

# Cohorts an admin configured (revision 0021_cohort_trees): parent (NULL: a root) and fair
# weight. A cohort a tenant names without a row is a root with no quota of its own.
cohorts = Table(
    "cohorts",
    metadata,
    Column("id", ID, nullable=False),
    Column("parent", ID),
    Column("fair_weight", Float, nullable=False, server_default="1"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    PrimaryKeyConstraint("id", name="pk_cohorts"),
    CheckConstraint("fair_weight BETWEEN 0.001 AND 1000", name="fair_weight_range"),
    CheckConstraint("parent IS NULL OR parent <> id", name="parent_not_self"),
)
Index("ix_cohorts_parent", cohorts.c.parent)

# A cohort's own quota per runtime class and resource: capacity that belongs to it and is
# lent to its subtree; the most it may use above its cap, and the most it lends up.
cohort_quotas = Table(
    "cohort_quotas",
    metadata,
    Column("cohort_id", ID, ForeignKey("cohorts.id", ondelete="CASCADE"), nullable=False),
    Column("runtime_class", ID, nullable=False),
    Column("resource", Text, nullable=False),
    Column("nominal", BigInteger, nullable=False),
    Column("borrowing_limit", BigInteger),
    Column("lending_limit", BigInteger),
    PrimaryKeyConstraint("cohort_id", "runtime_class", "resource", name="pk_cohort_quotas"),
    CheckConstraint(
        "resource IN ('cpuMillis', 'memoryMiB', 'llmSlots')", name="resource_known"
    ),
    CheckConstraint(
        "nominal >= 0 AND (borrowing_limit IS NULL OR borrowing_limit >= 0) "
        "AND (lending_limit IS NULL OR lending_limit >= 0)",
        name="amounts_valid",
    ),
)
Index("ix_cohort_quotas_runtime_class", cohort_quotas.c.runtime_class)

# Each cohort of the tree per managed (runtime class, resource): its parent and depth (the
# lock order: deepest first), its own nominal, ``cap`` (nominal + what its members lend up),
# ``lend`` (what of the cap it lends to its parent), ``lim`` (the most it may use; NULL: no
# limit of its own) and ``used``: what its members draw on it, each ``max(0, used - (cap -
# lend))`` of its own row (revision 0021_cohort_trees).
cohort_usage = Table(
    "cohort_usage",
    metadata,
    Column("cohort", ID, nullable=False),
    Column("runtime_class", ID, nullable=False),
    Column("resource", Text, nullable=False),
    Column("used", BigInteger, nullable=False, server_default="0"),
    Column("parent", ID),
    Column("depth", Integer, nullable=False, server_default="0"),
    Column("nominal", BigInteger, nullable=False, server_default="0"),
    Column("cap", BigInteger, nullable=False, server_default="0"),
    Column("lend", BigInteger, nullable=False, server_default="0"),
    Column("lim", BigInteger),
    PrimaryKeyConstraint("cohort", "runtime_class", "resource", name="pk_cohort_usage"),
    CheckConstraint("used >= 0", name="used_nonnegative"),
    CheckConstraint("lend BETWEEN 0 AND cap", name="lend_within_cap"),
)

# Fair sharing's decayed usage (revision 0022_fair_usage): per tenant, managed runtime class
# and resource, an exponentially decayed average of ``quota_usage.used``, brought up to date
# at most once per pass by the passes that order by it.
fair_usage = Table(
    "fair_usage",
    metadata,
    Column("tenant_id", ID, nullable=False),
    Column("runtime_class", ID, nullable=False),
    Column("resource", Text, nullable=False),
    Column("decayed", Float, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("tenant_id", "runtime_class", "resource", name="pk_fair_usage"),
    CheckConstraint("decayed >= 0", name="decayed_nonnegative"),
)

# A starving task's nomination (revision 0018_nominations): per pool it was promised (one
# nomination per pool at a time), the members it would place there and what they need.
# The capacity gathered for it is in ``reservations`` (hold rows), like a preemptor's.
nominations = Table(
    "nominations",
    metadata,
    Column("pool_id", ID, nullable=False),
    Column("task_id", UUID(as_uuid=True), nullable=False),
    Column("runtime_class", ID, nullable=False),
    Column("members", Integer, nullable=False),
    Column("cpu", BigInteger, nullable=False),
    Column("memory", BigInteger, nullable=False),
    Column("llm", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    PrimaryKeyConstraint("pool_id", name="pk_nominations"),
    CheckConstraint("members >= 1", name="members_positive"),
)
Index("ix_nominations_task_id", nominations.c.task_id)


# Recorded passes (revision 0020_pass_records): each committed pass's inputs and decisions,
# compressed (app.scheduling.recording), kept ``pass_records_seconds``. The static part of
# the snapshot is stored once per digest in ``pass_record_pools`` and named by the records.
pass_records = Table(
    "pass_records",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("pass_id", ID, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("pools_digest", ID, nullable=False),
    Column("task_ids", ARRAY(UUID(as_uuid=True)), nullable=False),
    Column("placed", Integer, nullable=False),
    Column("plan_digest", ID, nullable=False),
    Column("inputs", LargeBinary, nullable=False),
    Column("decisions", LargeBinary, nullable=False),
    PrimaryKeyConstraint("id", name="pk_pass_records"),
)
Index("ix_pass_records_recorded_at", pass_records.c.recorded_at)
Index("ix_pass_records_pass_id", pass_records.c.pass_id)
Index("ix_pass_records_pools_digest", pass_records.c.pools_digest)

pass_record_pools = Table(
    "pass_record_pools",
    metadata,
    Column("digest", ID, nullable=False),
    Column("used_at", DateTime(timezone=True), nullable=False),
    Column("pools", LargeBinary, nullable=False),
    PrimaryKeyConstraint("digest", name="pk_pass_record_pools"),
)
