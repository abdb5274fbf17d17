"""Claim indexes: admission order across shards, and a tenant's queue within a shard.

``ix_tasks_claim_order`` lets a reconciler that owns many slots take the oldest claimable
tasks in one ordered index scan (``ix_tasks_claimable`` is ordered within one slot only).
``ix_tasks_claim_tenant`` serves the ``fair`` claim: a loose index scan enumerates the
tenants present in the queue and each tenant's oldest tasks are read from it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CLAIMABLE = "state = 'ADMITTED' AND NOT parked"


def upgrade() -> None:
    """Apply this revision."""
    op.create_index(
        "ix_tasks_claim_order", "tasks", ["seq"], unique=False,
        postgresql_where=sa.text(CLAIMABLE),
    )
    op.create_index(
        "ix_tasks_claim_tenant", "tasks", ["shard", "tenant_id", "seq"], unique=False,
        postgresql_where=sa.text(CLAIMABLE),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_tasks_claim_tenant", table_name="tasks")
    op.drop_index("ix_tasks_claim_order", table_name="tasks")
