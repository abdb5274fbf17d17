"""Decayed usage for fair sharing: per tenant, runtime class and managed resource, an
exponentially decayed average of what its live leases use, and when it was last decayed.

A pass with a usage half-life set brings the rows of its tenants up to date once (from
``quota_usage``) and orders the tenants that borrow by them.

Revision ID: 0022_fair_usage
Revises: 0021_cohort_trees
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_fair_usage"
down_revision: str | None = "0021_cohort_trees"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.Text(collation="C")


def upgrade() -> None:
    op.create_table(
        "fair_usage",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("runtime_class", ID, nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("decayed", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "runtime_class", "resource", name="pk_fair_usage"),
        sa.CheckConstraint("decayed >= 0", name="ck_fair_usage_decayed_nonnegative"),
    )


def downgrade() -> None:
    op.drop_table("fair_usage")
