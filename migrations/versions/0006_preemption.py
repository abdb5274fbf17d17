"""Preemption: REVOKING leases with a deadline and a preemptor, and a task's preemption count.

* ``leases.state`` may be ``REVOKING``: the runtime is asked to stop the work by
  ``revoke_by`` (CHECK: a revoking lease has a deadline); ``preempted_by`` names the task its
  capacity is handed over to when the lease ends.
* The partial indexes of live leases (one live lease per task and pool, a runtime's leases,
  a pool's leases) cover ``ACTIVE`` and ``REVOKING``; two new ones find overdue revocations
  and a preemptor's victims.
* ``tasks.preemptions`` counts displacements: they use no attempt, and the next lease's
  fencing epoch (``attempts + preemptions + 1``) is still higher than the revoked one's.

Revision ID: 0006_preemption
Revises: 0005_keys_idempotency
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision: str = "0006_preemption"
down_revision: str | None = "0005_keys_idempotency"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "state IN ('ACTIVE', 'REVOKING')"
ACTIVE = "state = 'ACTIVE'"
STATES_OLD = "state IN ('ACTIVE', 'COMPLETED', 'EXPIRED', 'REVOKED', 'CANCELLED')"
STATES_NEW = "state IN ('ACTIVE', 'REVOKING', 'COMPLETED', 'EXPIRED', 'REVOKED', 'CANCELLED')"
#: (name, columns, unique) of the live-lease indexes whose predicate widens.
LIVE_INDEXES = (
    ("ix_leases_live_task_pool", ["task_id", "pool_id"], True),
    ("ix_leases_runtime_instance", ["runtime_instance_id"], False),
    ("ix_leases_pool_live", ["pool_id"], False),
)


def _live_indexes(predicate: str) -> None:
    for name, columns, unique in LIVE_INDEXES:
        op.drop_index(name, table_name="leases")
        op.create_index(name, "leases", columns, unique=unique,
                        postgresql_where=sa.text(predicate))


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("tasks", sa.Column("preemptions", sa.Integer(), nullable=False,
                                     server_default="0"))
    op.create_check_constraint(
        op.f("ck_tasks_preemptions_nonnegative"), "tasks", "preemptions >= 0"
    )
    op.add_column("leases", sa.Column("revoke_by", sa.DateTime(timezone=True)))
    op.add_column("leases", sa.Column("preempted_by", UUID(as_uuid=True)))
    op.drop_constraint(op.f("ck_leases_state_legal"), "leases", type_="check")
    op.create_check_constraint(op.f("ck_leases_state_legal"), "leases", STATES_NEW)
    op.create_check_constraint(
        op.f("ck_leases_revoking_has_deadline"), "leases",
        "state <> 'REVOKING' OR revoke_by IS NOT NULL",
    )
    _live_indexes(LIVE)
    op.create_index("ix_leases_revoke_by", "leases", ["revoke_by"],
                    postgresql_where=sa.text("state = 'REVOKING'"))
    op.create_index("ix_leases_preempted_by", "leases", ["preempted_by"],
                    postgresql_where=sa.text("state = 'REVOKING'"))


def downgrade() -> None:
    """Revert this revision (revoking leases become active again)."""
    op.drop_index("ix_leases_preempted_by", table_name="leases")
    op.drop_index("ix_leases_revoke_by", table_name="leases")
    op.execute("UPDATE leases SET state = 'ACTIVE' WHERE state = 'REVOKING'")
    _live_indexes(ACTIVE)
    op.drop_constraint(op.f("ck_leases_revoking_has_deadline"), "leases", type_="check")
    op.drop_constraint(op.f("ck_leases_state_legal"), "leases", type_="check")
    op.create_check_constraint(op.f("ck_leases_state_legal"), "leases", STATES_OLD)
    op.drop_column("leases", "preempted_by")
    op.drop_column("leases", "revoke_by")
    op.drop_constraint(op.f("ck_tasks_preemptions_nonnegative"), "tasks", type_="check")
    op.drop_column("tasks", "preemptions")
