"""One transaction per pass: claims are row locks, and fewer rows, indexes and checks per
placement.

* ``CLAIMED`` is no longer a stored state: a pass claims tasks with the row locks of
  ``FOR UPDATE SKIP LOCKED`` held by its one transaction (docs/decisions/
  0006-claims-are-row-locks.md). Tasks left ``CLAIMED`` by an older reconciler go back to
  ``ADMITTED``; ``claim_owner``, ``claim_expires_at``, their CHECK and the claim-expiry index
  are dropped, and the state CHECK no longer admits ``CLAIMED``.
* No foreign keys on the high-volume tables (``reservations``, ``leases``,
  ``task_events``): each one cost a key-share lock and an index probe per row written. What
  guards each invariant instead is in docs/decisions/0007-no-foreign-keys-on-hot-tables.md.

Revision ID: 0008_pass
Revises: 0006_preemption
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_pass"
down_revision: str | None = "0007_history"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATES_OLD = "state IN ('ADMITTED', 'CLAIMED', 'LEASED', 'SUCCEEDED', 'FAILED', 'CANCELLED')"
STATES_NEW = "state IN ('ADMITTED', 'LEASED', 'SUCCEEDED', 'FAILED', 'CANCELLED')"
CLAIM_IFF = "(state = 'CLAIMED') = (claim_owner IS NOT NULL AND claim_expires_at IS NOT NULL)"
#: (constraint, table, column, referred table, ON DELETE) of the foreign keys dropped.
FOREIGN_KEYS = (
    ("fk_reservations_task_id_tasks", "reservations", "task_id", "tasks", "CASCADE"),
    ("fk_reservations_pool_id_pools", "reservations", "pool_id", "pools", None),
    ("fk_leases_task_id_tasks", "leases", "task_id", "tasks", "CASCADE"),
    ("fk_leases_pool_id_pools", "leases", "pool_id", "pools", None),
    ("fk_task_events_task_id_tasks", "task_events", "task_id", "tasks", "CASCADE"),
)


def upgrade() -> None:
    """Apply this revision."""
    op.execute("UPDATE tasks SET state = 'ADMITTED' WHERE state = 'CLAIMED'")
    op.drop_index("ix_tasks_claim_expiry", table_name="tasks")
    op.drop_constraint(op.f("ck_tasks_claim_iff_claimed"), "tasks", type_="check")
    op.drop_column("tasks", "claim_owner")
    op.drop_column("tasks", "claim_expires_at")
    op.drop_constraint(op.f("ck_tasks_state_legal"), "tasks", type_="check")
    op.create_check_constraint(op.f("ck_tasks_state_legal"), "tasks", STATES_NEW)
    for name, table, *_ in FOREIGN_KEYS:
        op.drop_constraint(name, table, type_="foreignkey")


def downgrade() -> None:
    """Revert this revision (orphan rows, if any, must be deleted before the keys return)."""
    for name, table, column, referred, ondelete in FOREIGN_KEYS:
        op.create_foreign_key(name, table, referred, [column], ["id"], ondelete=ondelete)
    op.drop_constraint(op.f("ck_tasks_state_legal"), "tasks", type_="check")
    op.create_check_constraint(op.f("ck_tasks_state_legal"), "tasks", STATES_OLD)
    op.add_column("tasks", sa.Column("claim_expires_at", sa.DateTime(timezone=True)))
    op.add_column("tasks", sa.Column("claim_owner", sa.Text()))
    op.create_check_constraint(op.f("ck_tasks_claim_iff_claimed"), "tasks", CLAIM_IFF)
    op.create_index("ix_tasks_claim_expiry", "tasks", ["claim_expires_at"],
                    postgresql_where=sa.text("state = 'CLAIMED'"))
