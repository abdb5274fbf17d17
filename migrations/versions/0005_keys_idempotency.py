"""Keys over the API, idempotency per key, a per-tenant count of queued tasks.

* ``api_keys.last_used_at``: when a key was last used (recorded at most once a minute).
* ``idempotency_records`` are keyed by the API key's id instead of its subject, so two keys
  that share a subject never replay each other's answers; ``ix_idempotency_records_created_at``
  serves the sweeper that deletes records older than the retention. Existing records are
  carried over to every live key of their subject (the scope they had), so a retry in
  flight during the upgrade still replays.
* ``tenant_queue_counts``: how many tasks of each tenant are queued (ADMITTED, or CLAIMED by
  a reconciler looking at them), kept in 16 stripes per tenant so that concurrent writers
  rarely touch the same row. Statement-level triggers on ``tasks`` keep it exact for every
  insert, state change and delete; createTask reads the sum of a tenant's stripes (an index
  lookup of at most 16 rows) to enforce ``BERTH_MAX_QUEUED_TASKS_PER_TENANT``.

Revision ID: 0005_keys_idempotency
Revises: 0004_parking
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005_keys_idempotency"
down_revision: str | None = "0004_parking"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: States that count as queued, and the stripes of a tenant's count.
QUEUED = "('ADMITTED', 'CLAIMED')"
STRIPES = 16

_FUNCTION = f"""
CREATE FUNCTION berth_tenant_queue_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One upsert per statement and tenant, in tenant order (no deadlock between two
    -- statements that touch the same tenants), on the stripe of this backend.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tenant_queue_counts AS c (tenant_id, stripe, queued)
        SELECT tenant_id, pg_backend_pid() % {STRIPES}, count(*)
        FROM new_rows WHERE state IN {QUEUED}
        GROUP BY tenant_id ORDER BY tenant_id
        ON CONFLICT (tenant_id, stripe) DO UPDATE SET queued = c.queued + EXCLUDED.queued;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO tenant_queue_counts AS c (tenant_id, stripe, queued)
        SELECT d.tenant_id, pg_backend_pid() % {STRIPES}, sum(d.delta)
        FROM (
            SELECT n.tenant_id, 1 AS delta FROM new_rows n WHERE n.state IN {QUEUED}
            UNION ALL
            SELECT o.tenant_id, -1 FROM old_rows o WHERE o.state IN {QUEUED}
        ) d
        GROUP BY d.tenant_id HAVING sum(d.delta) <> 0 ORDER BY d.tenant_id
        ON CONFLICT (tenant_id, stripe) DO UPDATE SET queued = c.queued + EXCLUDED.queued;
    ELSE
        INSERT INTO tenant_queue_counts AS c (tenant_id, stripe, queued)
        SELECT tenant_id, pg_backend_pid() % {STRIPES}, -count(*)
        FROM old_rows WHERE state IN {QUEUED}
        GROUP BY tenant_id ORDER BY tenant_id
        ON CONFLICT (tenant_id, stripe) DO UPDATE SET queued = c.queued + EXCLUDED.queued;
    END IF;
    RETURN NULL;
END $$;
"""

#: One trigger per event: a trigger with transition tables may have only one event.
_TRIGGERS = {
    "insert": "INSERT ON tasks REFERENCING NEW TABLE AS new_rows",
    "update": "UPDATE ON tasks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
    "delete": "DELETE ON tasks REFERENCING OLD TABLE AS old_rows",
}

_BACKFILL = f"""
INSERT INTO tenant_queue_counts (tenant_id, stripe, queued)
SELECT tenant_id, 0, count(*) FROM tasks WHERE state IN {QUEUED} GROUP BY tenant_id
"""

_RECORDS_CARRY = """
INSERT INTO idempotency_records (key_id, operation, key, request_hash, status_code, response,
                                 created_at)
SELECT k.id, r.operation, r.key, r.request_hash, r.status_code, r.response, r.created_at
FROM idempotency_records_subject r JOIN api_keys k ON k.subject = r.subject
WHERE k.revoked_at IS NULL
"""


def _records_table(scope: str, scope_type: sa.types.TypeEngine) -> None:
    op.create_table(
        "idempotency_records",
        sa.Column(scope, scope_type, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint(scope, "operation", "key", name="pk_idempotency_records"),
    )


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("api_keys", sa.Column("last_used_at", sa.DateTime(timezone=True)))

    op.rename_table("idempotency_records", "idempotency_records_subject")
    op.execute(
        "ALTER TABLE idempotency_records_subject RENAME CONSTRAINT pk_idempotency_records "
        "TO pk_idempotency_records_subject"
    )
    _records_table("key_id", postgresql.UUID(as_uuid=True))
    op.execute(_RECORDS_CARRY)
    op.drop_table("idempotency_records_subject")
    op.create_index(
        "ix_idempotency_records_created_at", "idempotency_records", ["created_at"], unique=False
    )

    op.create_table(
        "tenant_queue_counts",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("stripe", sa.SmallInteger(), nullable=False),
        sa.Column("queued", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "stripe", name="pk_tenant_queue_counts"),
    )
    op.execute(_FUNCTION)
    for name, event in _TRIGGERS.items():
        op.execute(
            f"CREATE TRIGGER tasks_queue_count_{name} AFTER {event} "
            "FOR EACH STATEMENT EXECUTE FUNCTION berth_tenant_queue_count()"
        )
    op.execute(_BACKFILL)


def downgrade() -> None:
    """Revert this revision (idempotency records are dropped: they are a replay cache)."""
    for name in _TRIGGERS:
        op.execute(f"DROP TRIGGER tasks_queue_count_{name} ON tasks")
    op.execute("DROP FUNCTION berth_tenant_queue_count()")
    op.drop_table("tenant_queue_counts")
    op.drop_index("ix_idempotency_records_created_at", table_name="idempotency_records")
    op.drop_table("idempotency_records")
    _records_table("subject", sa.Text())
    op.drop_column("api_keys", "last_used_at")
