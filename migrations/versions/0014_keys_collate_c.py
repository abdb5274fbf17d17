"""Tenant, pool and runtime-instance ids compare bytewise (``COLLATE "C"``), whatever the
server's locale.

A lease inserts index entries keyed by these ids (``ix_tasks_tenant_seq``,
``ix_tasks_leased_tenant``, ``ix_leases_pool_live``, ``ix_leases_runtime_instance``, the
primary keys of ``reservations`` and ``tenant_queue_counts``), and the ledger statements sort
and find pools by id. Under a locale other than C (an external cluster initialized with
``C.UTF-8`` or ``en_US.UTF-8``; the embedded one uses ``--no-locale``), each comparison went
through ``strcoll``: about 49,000 of them, 11.3 M instructions, in the lease statement of a
replayed pass of 1,024 placements at 1,000 pools. Ids are machine identifiers: bytewise order
is the embedded server's order, now every server's. Decision 14.

Only the collation changes (no table is rewritten); PostgreSQL rebuilds the indexes on these
columns.

Revision ID: 0014_keys_collate_c
Revises: 0013_spec_json
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014_keys_collate_c"
down_revision: str | None = "0013_spec_json"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The id columns, by table.
COLUMNS = {
    "pools": ("id", "runtime_instance_id"),
    "ledgers": ("pool_id",),
    "runtime_instances": ("id",),
    "tasks": ("tenant_id",),
    "reservations": ("pool_id",),
    "leases": ("pool_id", "runtime_instance_id"),
    "tenant_queue_counts": ("tenant_id",),
}


def _collate(collation: str) -> None:
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f'ALTER COLUMN {c} TYPE text COLLATE "{collation}"' for c in columns
        )
        op.execute(f"ALTER TABLE {table} {changes}")


def upgrade() -> None:
    """Apply this revision."""
    _collate("C")


def downgrade() -> None:
    """Revert this revision (the database's default collation)."""
    _collate("default")
