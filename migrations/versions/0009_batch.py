"""Two fewer index entries per task written: ``uq_tasks_seq`` and ``ix_tasks_claimable``.

* ``uq_tasks_seq`` only enforced what the identity already guarantees: ``seq`` is
  ``GENERATED ALWAYS`` from its sequence, and no query looks a task up by ``seq`` alone
  (lists use ``ix_tasks_tenant_seq``, claims ``ix_tasks_claim_order``).
  docs/decisions/0008-seq-unique-by-identity.md says what guards uniqueness instead.
* ``ix_tasks_claimable (shard, seq)`` duplicated the two other claim indexes of the same
  predicate: a reconciler's claim in admission order reads ``ix_tasks_claim_order (seq)``,
  and every read of a slot's claimable tasks can use ``ix_tasks_claim_tenant (shard,
  tenant_id, seq)``, whose leading column is the slot.

Every submitted task wrote both (8 index entries per task, now 6), and every placement
(a non-HOT update of the task) wrote one into ``uq_tasks_seq``.

Revision ID: 0009_batch
Revises: 0008_pass
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_batch"
down_revision: str | None = "0008_pass"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CLAIMABLE = "state = 'ADMITTED' AND NOT parked"


def upgrade() -> None:
    """Apply this revision."""
    op.drop_index("ix_tasks_claimable", table_name="tasks")
    op.drop_constraint("uq_tasks_seq", "tasks", type_="unique")


def downgrade() -> None:
    """Revert this revision."""
    op.create_unique_constraint("uq_tasks_seq", "tasks", ["seq"])
    op.create_index(
        "ix_tasks_claimable", "tasks", ["shard", "seq"], unique=False,
        postgresql_where=sa.text(CLAIMABLE),
    )
