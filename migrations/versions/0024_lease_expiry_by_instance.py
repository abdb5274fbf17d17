"""One index of live leases by runtime instance and expiry, instead of two.

``ix_leases_runtime_instance`` (live leases by instance: heartbeats, a runtime's lease list)
and ``ix_leases_expiry`` (active leases by expiry: recovery) become one index,
``ix_leases_instance_expiry`` on ``(runtime_instance_id, expires_at)`` of the live leases.
A lease then writes four index entries instead of five, and so does every renewal of it by
a heartbeat. Recovery reads that index whole for the expired leases, testing the expiry
(its second column) on each entry: the read grows with the live leases, not with the ended
ones.

The index is created ``IF NOT EXISTS``: on a large ``leases`` table an operator may build it
first with ``CREATE INDEX CONCURRENTLY`` (docs/operations.md).

Revision ID: 0024_lease_expiry_by_instance
Revises: 0023_watch_quiet_admissions
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024_lease_expiry_by_instance"
down_revision: str | None = "0023_watch_quiet_admissions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIVE = sa.text("state IN ('ACTIVE', 'REVOKING')")


def upgrade() -> None:
    """Apply this revision."""
    op.create_index("ix_leases_instance_expiry", "leases",
                    ["runtime_instance_id", "expires_at"], postgresql_where=_LIVE,
                    if_not_exists=True)
    op.drop_index("ix_leases_runtime_instance", table_name="leases")
    op.drop_index("ix_leases_expiry", table_name="leases")


def downgrade() -> None:
    """Revert this revision."""
    op.create_index("ix_leases_expiry", "leases", ["expires_at"],
                    postgresql_where=sa.text("state = 'ACTIVE'"))
    op.create_index("ix_leases_runtime_instance", "leases", ["runtime_instance_id"],
                    postgresql_where=_LIVE)
    op.drop_index("ix_leases_instance_expiry", table_name="leases")
