"""Room on the tasks' pages for their next row version (``fillfactor = 35``).

A placement updates its task's row (state, placement text, times): the update is never HOT
(``state`` is in the claim indexes' predicates), but when the new version fits on the old
one's page PostgreSQL logs only the bytes that changed at the row's start and end, logs one
page instead of two, and needs no separate row-lock record to free the old page while it
finds room elsewhere. A task's row roughly doubles when it is leased (its placement text):
admissions now fill a page to 35 %, so that the leased versions of a page's tasks, leased
together in admission order, fit beside them. Pages written before this revision keep their
rows; the space applies to pages filled from now on.

Revision ID: 0024b_tasks_fillfactor
Revises: 0024_lease_expiry_by_instance
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0024b_tasks_fillfactor"
down_revision: str | None = "0024_lease_expiry_by_instance"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.execute("ALTER TABLE tasks SET (fillfactor = 35)")


def downgrade() -> None:
    """Revert this revision."""
    op.execute("ALTER TABLE tasks RESET (fillfactor)")
