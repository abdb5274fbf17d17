"""Partial unique index for task idempotency keys: only rows that carry a key.

The unique constraint ``uq_tasks_tenant_idempotency_key`` indexed every task, NULL keys
included, so each of the (non-HOT) task updates of a placement — claim, lease — added an
entry to it. As a partial unique index ``WHERE idempotency_key IS NOT NULL`` (same name,
same uniqueness for keyed tasks) it holds only the tasks submitted with a key. The submit
statement's ``ON CONFLICT`` names the predicate so that PostgreSQL infers this index.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "uq_tasks_tenant_idempotency_key"
KEYED = "idempotency_key IS NOT NULL"


def upgrade() -> None:
    """Apply this revision."""
    op.drop_constraint(NAME, "tasks", type_="unique")
    op.create_index(
        NAME, "tasks", ["tenant_id", "idempotency_key"], unique=True,
        postgresql_where=sa.text(KEYED),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(NAME, table_name="tasks")
    op.create_unique_constraint(NAME, "tasks", ["tenant_id", "idempotency_key"])
