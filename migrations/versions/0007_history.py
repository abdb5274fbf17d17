"""History: the pass's reads and the retention sweep read only live rows, never finished ones.

* ``ix_tasks_leased_tenant``: leased tasks by tenant. Affinity's placement counts, the
  preemption victims and the placements read look up the *leased* tasks of a few tenants;
  with only ``ix_tasks_tenant_seq`` (every task a tenant ever had) their cost grew with the
  finished tasks kept (2.2 s per pass at 1,000,000 finished tasks).
* ``ix_tasks_finished``: finished tasks by finish time, the retention sweep's range
  (``app.ledger.retention``).
* ``ix_leases_task_id``: the ended leases of a task: the retention sweep deletes a pruned
  task's leases by task (the only other index led by ``task_id`` covers live leases).
  Partial, so that a placement, which inserts a live lease, writes no entry in it.

The indexes are created ``IF NOT EXISTS``: on a large ``tasks`` table an operator may build
them first with ``CREATE INDEX CONCURRENTLY`` under the same names (docs/operations.md,
"History and retention") and the migration then takes no lock for them.

Revision ID: 0007_history
Revises: 0006_preemption
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_history"
down_revision: str | None = "0006_preemption"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LEASED = "state = 'LEASED'"
FINISHED = "state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
ENDED_LEASE = "state NOT IN ('ACTIVE', 'REVOKING')"


def upgrade() -> None:
    """Apply this revision."""
    op.create_index("ix_tasks_leased_tenant", "tasks", ["tenant_id"],
                    postgresql_where=sa.text(LEASED), if_not_exists=True)
    op.create_index("ix_tasks_finished", "tasks", ["finished_at"],
                    postgresql_where=sa.text(FINISHED), if_not_exists=True)
    op.create_index("ix_leases_task_id", "leases", ["task_id"],
                    postgresql_where=sa.text(ENDED_LEASE), if_not_exists=True)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_leases_task_id", table_name="leases")
    op.drop_index("ix_tasks_finished", table_name="tasks")
    op.drop_index("ix_tasks_leased_tenant", table_name="tasks")
