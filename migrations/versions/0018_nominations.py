"""Nominations: a task that starved is promised the capacity freed on some pools.

One row per nominated pool (one nomination per pool at a time: the primary key), with the
members the nominee would place there and what they need. The capacity itself is held in
``reservations`` (hold rows), like a preemptor's.

Revision ID: 0018_nominations
Revises: 0017_tenant_quotas
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018_nominations"
down_revision: str | None = "0017_tenant_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.Text(collation="C")


def upgrade() -> None:
    op.create_table(
        "nominations",
        sa.Column("pool_id", ID, nullable=False),
        sa.Column("task_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("runtime_class", ID, nullable=False),
        sa.Column("members", sa.Integer(), nullable=False),
        sa.Column("cpu", sa.BigInteger(), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.Column("llm", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("pool_id", name="pk_nominations"),
        sa.CheckConstraint("members >= 1", name="ck_nominations_members_positive"),
    )
    op.create_index("ix_nominations_task_id", "nominations", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_nominations_task_id", table_name="nominations")
    op.drop_table("nominations")
