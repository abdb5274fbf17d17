"""Less PostgreSQL work per placement.

* ``tasks.placement`` is ``json``, not ``jsonb``: it is written once per lease and read
  whole (the task view), never searched, so PostgreSQL only validates the text instead of
  building a binary document from it.
* ``ledgers`` keeps half of each page free (``fillfactor = 50``): every pass updates the
  rows of the pools it placed on, and a new row version that fits on its page is a HOT
  update (no index entry). The table is rewritten so that existing pages get that space.

Revision ID: 0009_pg
Revises: 0008_pass
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009_pg"
down_revision: str | None = "0008_pass"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.execute("ALTER TABLE tasks ALTER COLUMN placement TYPE json USING placement::json")
    op.execute("ALTER TABLE ledgers SET (fillfactor = 50)")
    op.execute("CLUSTER ledgers USING pk_ledgers")


def downgrade() -> None:
    """Revert this revision."""
    op.execute("ALTER TABLE ledgers RESET (fillfactor)")
    op.execute("ALTER TABLE tasks ALTER COLUMN placement TYPE jsonb USING placement::jsonb")
