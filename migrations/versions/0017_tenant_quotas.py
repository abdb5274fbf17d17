"""Tenants and their quotas: cohort, fair weight, and per runtime class and resource the
nominal quota, borrowing limit and lending limit; what each tenant uses of each managed
runtime class and resource, and what each cohort borrows.

Revision ID: 0017_tenant_quotas
Revises: 0016_placement_format
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_tenant_quotas"
down_revision: str | None = "0016_placement_format"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.Text(collation="C")


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", ID, nullable=False),
        sa.Column("cohort", ID, nullable=False, server_default="default"),
        sa.Column("fair_weight", sa.Float(), nullable=False, server_default="1"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        sa.CheckConstraint("fair_weight > 0", name="ck_tenants_fair_weight_positive"),
    )
    op.create_index("ix_tenants_cohort", "tenants", ["cohort"])
    op.create_table(
        "tenant_quotas",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("runtime_class", ID, nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("nominal", sa.BigInteger(), nullable=False),
        sa.Column("borrowing_limit", sa.BigInteger()),
        sa.Column("lending_limit", sa.BigInteger()),
        sa.PrimaryKeyConstraint("tenant_id", "runtime_class", "resource",
                                name="pk_tenant_quotas"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE",
                                name="fk_tenant_quotas_tenant_id_tenants"),
        sa.CheckConstraint("resource IN ('cpuMillis', 'memoryMiB', 'llmSlots')",
                           name="ck_tenant_quotas_resource_known"),
        sa.CheckConstraint(
            "nominal >= 0 AND (borrowing_limit IS NULL OR borrowing_limit >= 0) "
            "AND (lending_limit IS NULL OR lending_limit BETWEEN 0 AND nominal)",
            name="ck_tenant_quotas_amounts_valid",
        ),
    )
    op.create_index("ix_tenant_quotas_runtime_class", "tenant_quotas", ["runtime_class"])
    op.create_table(
        "quota_usage",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("runtime_class", ID, nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("cohort", ID, nullable=False),
        sa.Column("nominal", sa.BigInteger(), nullable=False),
        sa.Column("cap", sa.BigInteger()),
        sa.Column("lend", sa.BigInteger()),
        sa.Column("used", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("tenant_id", "runtime_class", "resource",
                                name="pk_quota_usage"),
        sa.CheckConstraint("used >= 0 AND nominal >= 0",
                           name="ck_quota_usage_used_nonnegative"),
        sa.CheckConstraint("cap IS NULL OR used <= cap", name="ck_quota_usage_used_within_cap"),
    )
    op.create_index("ix_quota_usage_cohort", "quota_usage", ["cohort", "runtime_class"])
    op.create_table(
        "cohort_usage",
        sa.Column("cohort", ID, nullable=False),
        sa.Column("runtime_class", ID, nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("borrowed", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("cohort", "runtime_class", "resource", name="pk_cohort_usage"),
        sa.CheckConstraint("borrowed >= 0", name="ck_cohort_usage_borrowed_nonnegative"),
    )


def downgrade() -> None:
    op.drop_table("cohort_usage")
    op.drop_table("quota_usage")
    op.drop_table("tenant_quotas")
    op.drop_table("tenants")
