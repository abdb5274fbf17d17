"""Parking and queue position: wake conditions of parked tasks, the pending stage, and the
indexes that make wakeups selective and a task's queue position cheap.

* ``tasks.wake``: the keys of the events that could let a parked task fit (``pool:<id>``,
  ``cap:<class>``, ``class:<class>``, ``placed:<tenant>``); a GIN index over the parked
  tasks lets a wakeup unpark exactly the tasks whose keys it carries.
* ``tasks.pending_stage``: the stage (SPEC §4) of the task's closest miss; tasks that no
  released capacity can help (stages below capacity) do not compete for pools, so they are
  left out of the queue indexes.
* ``ix_tasks_queue_seq``: the competing queue of a runtime class in admission order (one
  bounded range read gives every policy's positions, see ``app.scheduling.positions``).
* ``ix_leases_pool_completed``: recent completions per pool (the ETA's observed rate).

Revision ID: 0004_parking
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0004_parking"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PARKED = "state = 'ADMITTED' AND parked"
COMPETING = (
    "state IN ('ADMITTED', 'CLAIMED') AND (pending_stage IS NULL OR pending_stage >= 4)"
)


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("tasks", sa.Column("wake", ARRAY(sa.Text()), nullable=True))
    op.add_column("tasks", sa.Column("pending_stage", sa.SmallInteger(), nullable=True))
    op.create_index(
        "ix_tasks_parked_wake", "tasks", ["wake"], unique=False,
        postgresql_using="gin", postgresql_where=sa.text(PARKED),
    )
    op.create_index(
        "ix_tasks_queue_seq", "tasks", ["runtime_class", "seq"], unique=False,
        postgresql_where=sa.text(COMPETING),
    )
    op.create_index(
        "ix_leases_pool_completed", "leases", ["pool_id", "ended_at"], unique=False,
        postgresql_where=sa.text("state = 'COMPLETED'"),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_leases_pool_completed", table_name="leases")
    op.drop_index("ix_tasks_queue_seq", table_name="tasks")
    op.drop_index("ix_tasks_parked_wake", table_name="tasks")
    op.drop_column("tasks", "pending_stage")
    op.drop_column("tasks", "wake")
