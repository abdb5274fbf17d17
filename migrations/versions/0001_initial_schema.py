"""Initial schema: pools, ledgers, runtime instances, tasks, reservations, leases, events, keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "api_keys",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("tenant_ids", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
        sa.Column(
            "runtime_instance_ids", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column("bootstrap", sa.Boolean(), server_default="false", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "role IN ('admin', 'operator', 'tenant', 'runtime')",
            name=op.f("ck_api_keys_role_legal"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index("ix_api_keys_prefix", "api_keys", ["prefix"], unique=False)
    op.create_index(
        "ix_api_keys_bootstrap",
        "api_keys",
        ["bootstrap"],
        unique=True,
        postgresql_where=sa.text("bootstrap"),
    )
    op.create_table(
        "idempotency_records",
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("subject", "operation", "key", name="pk_idempotency_records"),
    )
    op.create_table(
        "pools",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("tenant_ids", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
        sa.Column("runtime_class", sa.Text(), nullable=False),
        sa.Column("runtime_instance_id", sa.Text(), nullable=False),
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("data_residency", sa.Text(), server_default="", nullable=False),
        sa.Column("failure_domain", sa.Text(), server_default="", nullable=False),
        sa.Column(
            "labels", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column(
            "artifact_regions", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column("cost_weight", sa.Float(), server_default="1", nullable=False),
        sa.Column("operators", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
        sa.Column("status", sa.Text(), server_default="ACTIVE", nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("drain_deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ready", sa.Boolean(), server_default="true", nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="1", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "id ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'", name=op.f("ck_pools_id_slug")
        ),
        sa.CheckConstraint(
            "status IN ('ACTIVE', 'CORDONED', 'DRAINING')", name=op.f("ck_pools_status_legal")
        ),
        sa.CheckConstraint("cost_weight >= 0", name=op.f("ck_pools_cost_weight_nonnegative")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_pools_version_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pools")),
    )
    op.create_index("ix_pools_runtime_instance_id", "pools", ["runtime_instance_id"], unique=False)
    op.create_table(
        "runtime_instances",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "first_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_instances")),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), server_default="ADMITTED", nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("runtime_class", sa.Text(), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "labels", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column("pending_reason", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("parked", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("placement", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="3", nullable=False),
        sa.Column("claim_owner", sa.Text(), nullable=True),
        sa.Column("claim_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "admitted_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("leased_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(state = 'CLAIMED') = (claim_owner IS NOT NULL AND claim_expires_at IS NOT NULL)",
            name=op.f("ck_tasks_claim_iff_claimed"),
        ),
        sa.CheckConstraint(
            "state IN ('ADMITTED', 'CLAIMED', 'LEASED', 'SUCCEEDED', 'FAILED', 'CANCELLED')",
            name=op.f("ck_tasks_state_legal"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_tasks_attempts_nonnegative")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_tasks_max_attempts_positive")),
        sa.CheckConstraint("shard >= 0", name=op.f("ck_tasks_shard_nonnegative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint("seq", name=op.f("uq_tasks_seq")),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_tasks_tenant_idempotency_key"),
    )
    op.create_index(
        "ix_tasks_claim_expiry",
        "tasks",
        ["claim_expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'CLAIMED'"),
    )
    op.create_index(
        "ix_tasks_claimable",
        "tasks",
        ["shard", "seq"],
        unique=False,
        postgresql_where=sa.text("state = 'ADMITTED' AND NOT parked"),
    )
    op.create_index(
        "ix_tasks_parked",
        "tasks",
        ["shard"],
        unique=False,
        postgresql_where=sa.text("state = 'ADMITTED' AND parked"),
    )
    op.create_index("ix_tasks_tenant_seq", "tasks", ["tenant_id", "seq"], unique=False)
    op.create_table(
        "leases",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("task_id", sa.UUID(), nullable=False),
        sa.Column("pool_id", sa.Text(), nullable=False),
        sa.Column("runtime_instance_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), server_default="ACTIVE", nullable=False),
        sa.Column(
            "granted_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "state IN ('ACTIVE', 'COMPLETED', 'EXPIRED', 'REVOKED', 'CANCELLED')",
            name=op.f("ck_leases_state_legal"),
        ),
        sa.CheckConstraint("epoch >= 1", name=op.f("ck_leases_epoch_positive")),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.id"], name=op.f("fk_leases_pool_id_pools")),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_leases_task_id_tasks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leases")),
    )
    op.create_index(
        "ix_leases_expiry",
        "leases",
        ["expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'ACTIVE'"),
    )
    op.create_index(
        "ix_leases_live_task_pool",
        "leases",
        ["task_id", "pool_id"],
        unique=True,
        postgresql_where=sa.text("state = 'ACTIVE'"),
    )
    op.create_index(
        "ix_leases_pool_live",
        "leases",
        ["pool_id"],
        unique=False,
        postgresql_where=sa.text("state = 'ACTIVE'"),
    )
    op.create_index(
        "ix_leases_runtime_instance",
        "leases",
        ["runtime_instance_id"],
        unique=False,
        postgresql_where=sa.text("state = 'ACTIVE'"),
    )
    op.create_table(
        "ledgers",
        sa.Column("pool_id", sa.Text(), nullable=False),
        sa.Column("cpu_total", sa.BigInteger(), nullable=False),
        sa.Column("memory_total", sa.BigInteger(), nullable=False),
        sa.Column("llm_total", sa.BigInteger(), nullable=False),
        sa.Column("cpu_reserved", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("memory_reserved", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("llm_reserved", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "cpu_reserved >= 0 AND cpu_reserved <= cpu_total",
            name=op.f("ck_ledgers_cpu_within_total"),
        ),
        sa.CheckConstraint(
            "llm_reserved >= 0 AND llm_reserved <= llm_total",
            name=op.f("ck_ledgers_llm_within_total"),
        ),
        sa.CheckConstraint(
            "memory_reserved >= 0 AND memory_reserved <= memory_total",
            name=op.f("ck_ledgers_memory_within_total"),
        ),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.id"], name=op.f("fk_ledgers_pool_id_pools"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("pool_id", name=op.f("pk_ledgers")),
    )
    op.create_table(
        "reservations",
        sa.Column("task_id", sa.UUID(), nullable=False),
        sa.Column("pool_id", sa.Text(), nullable=False),
        sa.Column("members", sa.Integer(), server_default="1", nullable=False),
        sa.Column("cpu", sa.BigInteger(), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.Column("llm", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "cpu >= 0 AND memory >= 0 AND llm >= 0",
            name=op.f("ck_reservations_amounts_nonnegative"),
        ),
        sa.CheckConstraint("members >= 1", name=op.f("ck_reservations_members_positive")),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.id"], name=op.f("fk_reservations_pool_id_pools")
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
            name=op.f("fk_reservations_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "pool_id", name="pk_reservations"),
    )
    op.create_index("ix_reservations_pool_id", "reservations", ["pool_id"], unique=False)
    op.create_table(
        "task_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("task_id", sa.UUID(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("from_state", sa.Text(), nullable=True),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_task_events_task_id_tasks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_events")),
    )
    op.create_index("ix_task_events_task_id", "task_events", ["task_id", "id"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_task_events_task_id", table_name="task_events")
    op.drop_table("task_events")
    op.drop_index("ix_reservations_pool_id", table_name="reservations")
    op.drop_table("reservations")
    op.drop_table("ledgers")
    op.drop_index(
        "ix_leases_runtime_instance",
        table_name="leases",
        postgresql_where=sa.text("state = 'ACTIVE'"),
    )
    op.drop_index(
        "ix_leases_pool_live", table_name="leases", postgresql_where=sa.text("state = 'ACTIVE'")
    )
    op.drop_index(
        "ix_leases_live_task_pool",
        table_name="leases",
        postgresql_where=sa.text("state = 'ACTIVE'"),
    )
    op.drop_index(
        "ix_leases_expiry", table_name="leases", postgresql_where=sa.text("state = 'ACTIVE'")
    )
    op.drop_table("leases")
    op.drop_index("ix_tasks_tenant_seq", table_name="tasks")
    op.drop_index(
        "ix_tasks_parked",
        table_name="tasks",
        postgresql_where=sa.text("state = 'ADMITTED' AND parked"),
    )
    op.drop_index(
        "ix_tasks_claimable",
        table_name="tasks",
        postgresql_where=sa.text("state = 'ADMITTED' AND NOT parked"),
    )
    op.drop_index(
        "ix_tasks_claim_expiry", table_name="tasks", postgresql_where=sa.text("state = 'CLAIMED'")
    )
    op.drop_table("tasks")
    op.drop_table("runtime_instances")
    op.drop_index("ix_pools_runtime_instance_id", table_name="pools")
    op.drop_table("pools")
    op.drop_table("idempotency_records")
    op.drop_index("ix_api_keys_prefix", table_name="api_keys")
    op.drop_index(
        "ix_api_keys_bootstrap", table_name="api_keys", postgresql_where=sa.text("bootstrap")
    )
    op.drop_table("api_keys")
