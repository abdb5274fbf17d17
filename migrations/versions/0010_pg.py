"""Less PostgreSQL work per placement.

* ``tasks.placement`` is ``json``, not ``jsonb``: it is written once per lease and read
  whole (the task view), never searched, so PostgreSQL only validates the text instead of
  building a binary document from it.
* ``ledgers`` keeps half of each page free (``fillfactor = 50``): every pass updates the
  rows of the pools it placed on, and a new row version that fits on its page is a HOT
  update (no index entry). The table is rewritten so that existing pages get that space.
* ``reservations.hold`` marks a preemptor's hold; ``ix_reservations_pool_id`` (every
  reservation by pool) becomes ``ix_reservations_pool_hold`` (holds only). A pool's other
  reservations are those of its live leases, reached through ``ix_leases_pool_live`` and the
  primary key, so a placement's reservation writes one index entry instead of two. Existing
  holds are the reservations of tasks that are not ``LEASED``.

Revision ID: 0010_pg
Revises: 0009_batch
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_pg"
down_revision: str | None = "0009_batch"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.execute("ALTER TABLE tasks ALTER COLUMN placement TYPE json USING placement::json")
    op.execute("ALTER TABLE ledgers SET (fillfactor = 50)")
    op.execute("CLUSTER ledgers USING pk_ledgers")
    op.add_column(
        "reservations",
        sa.Column("hold", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.execute(
        "UPDATE reservations r SET hold = true FROM tasks t "
        "WHERE t.id = r.task_id AND t.state <> 'LEASED'"
    )
    op.drop_index("ix_reservations_pool_id", table_name="reservations")
    op.create_index("ix_reservations_pool_hold", "reservations", ["pool_id"],
                    postgresql_where=sa.text("hold"))


def downgrade() -> None:
    """Revert this revision."""
    op.create_index("ix_reservations_pool_id", "reservations", ["pool_id"])
    op.drop_index("ix_reservations_pool_hold", table_name="reservations")
    op.drop_column("reservations", "hold")
    op.execute("ALTER TABLE ledgers RESET (fillfactor)")
    op.execute("ALTER TABLE tasks ALTER COLUMN placement TYPE jsonb USING placement::jsonb")
