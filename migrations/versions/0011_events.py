"""One index per task event instead of two: the primary key is ``(task_id, id)``.

``task_events`` had a primary key on ``id`` and ``ix_task_events_task_id (task_id, id)``.
Every read of events goes by task (a task's trail, retention, the undo of a lost race), so
the second index served every query and the first only made ``id`` unique, which its
identity (``GENERATED ALWAYS``) already does. The primary key is now ``(task_id, id)``, the
same entries as the old secondary index: an event (one per submitted task, one per
placement, one per later transition) writes one index entry instead of two.

Revision ID: 0011_events
Revises: 0010_pg
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011_events"
down_revision: str | None = "0010_pg"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.drop_constraint("pk_task_events", "task_events", type_="primary")
    op.drop_index("ix_task_events_task_id", table_name="task_events")
    op.create_primary_key("pk_task_events", "task_events", ["task_id", "id"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_constraint("pk_task_events", "task_events", type_="primary")
    op.create_primary_key("pk_task_events", "task_events", ["id"])
    op.create_index("ix_task_events_task_id", "task_events", ["task_id", "id"], unique=False)
