"""Opaque tokens and coalesced parking events.

* ``server_secrets``: secrets the server generates once and every process reads. The
  ``tokens`` secret seals list cursors and event ids, so that neither reveals how many tasks
  or events the whole service holds (the first process that needs it inserts it; see
  ``app.services.tokens``).
* ``tasks.logged_code`` and ``tasks.logged_at``: the pending code the task's event log last
  recorded, and when. A parked task whose pending reason changes because a pool's health
  flaps writes at most one event per park sweep period; the latest reason is on the task at
  once, and the log catches up at a later re-examination.
* ``tasks.logged_count``: how many pending-reason events the task logged. Past
  ``BERTH_TASK_EVENTS_KEPT`` each new one trims the task's log to its first event and its
  latest ones, so a task that never finishes keeps a bounded history.

Adding nullable columns, or one with a constant default, does not rewrite ``tasks``.

Revision ID: 0015_tokens_coalescing
Revises: 0014_keys_collate_c
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_tokens_coalescing"
down_revision: str | None = "0014_keys_collate_c"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("secret", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("name", name="pk_server_secrets"),
    )
    op.add_column("tasks", sa.Column("logged_code", sa.Text(), nullable=True))
    op.add_column("tasks", sa.Column("logged_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("tasks", sa.Column("logged_count", sa.Integer(), nullable=False,
                                     server_default="0"))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("tasks", "logged_count")
    op.drop_column("tasks", "logged_at")
    op.drop_column("tasks", "logged_code")
    op.drop_table("server_secrets")
