"""Recorded passes: each committed pass's inputs and decisions, for replay.

``pass_records`` holds one row per committed pass (compressed inputs and decisions, the
tasks it decided, a digest of its plan); ``pass_record_pools`` holds the static part of the
snapshot once per digest, named by the records. Both are pruned by age.

Revision ID: 0020_pass_records
Revises: 0019_watch_feed
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020_pass_records"
down_revision: str | None = "0019_watch_feed"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.Text(collation="C")


def upgrade() -> None:
    op.create_table(
        "pass_records",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("pass_id", ID, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pools_digest", ID, nullable=False),
        sa.Column("task_ids", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("placed", sa.Integer(), nullable=False),
        sa.Column("plan_digest", ID, nullable=False),
        sa.Column("inputs", sa.LargeBinary(), nullable=False),
        sa.Column("decisions", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pass_records"),
    )
    op.create_index("ix_pass_records_recorded_at", "pass_records", ["recorded_at"])
    op.create_index("ix_pass_records_pass_id", "pass_records", ["pass_id"])
    op.create_index("ix_pass_records_pools_digest", "pass_records", ["pools_digest"])
    op.create_table(
        "pass_record_pools",
        sa.Column("digest", ID, nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pools", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_pass_record_pools"),
    )


def downgrade() -> None:
    op.drop_table("pass_record_pools")
    op.drop_index("ix_pass_records_pools_digest", table_name="pass_records")
    op.drop_index("ix_pass_records_pass_id", table_name="pass_records")
    op.drop_index("ix_pass_records_recorded_at", table_name="pass_records")
    op.drop_table("pass_records")
