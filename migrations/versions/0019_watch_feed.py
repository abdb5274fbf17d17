"""The watch feed: each event row records its writing transaction; pools log their changes.

* ``task_events.xid``: the top-level transaction id (``pg_current_xact_id()`` as bigint) of
  the transaction that wrote the row. A watcher's cursor is a position in the event ids plus
  the snapshot it read at; the ids of the transactions still in progress then are how it
  finds, later, the events that committed after others with higher ids (no gaps).
* ``pool_events``: one row per change of a pool (created, updated, status, deleted), written
  by a trigger on ``pools``. Its ids come from the sequence of ``task_events.id``, so the
  two logs share one order of positions.
* a BRIN index on ``task_events (id, xid)``: the feed reads recent id and xid ranges; a
  BRIN summary costs a placement nothing per row, where a btree would add an entry.
* statement triggers ``NOTIFY berth_watch`` after rows are added to either log, so that each
  API process's one listener wakes its watchers at commit.

Revision ID: 0019_watch_feed
Revises: 0018_nominations
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019_watch_feed"
down_revision: str | None = "0018_nominations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.Text(collation="C")
XID = "(pg_current_xact_id()::text)::bigint"

_POOL_LOG = """
CREATE FUNCTION berth_pool_log() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p pools;
    kind text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        p := OLD;
        kind := 'deleted';
    ELSE
        p := NEW;
        IF TG_OP = 'INSERT' THEN
            kind := 'created';
        ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
            kind := lower(NEW.status);
        ELSIF NEW.version IS DISTINCT FROM OLD.version THEN
            kind := 'updated';
        ELSE
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO pool_events (pool_id, kind, status, version, runtime_class, operators)
    VALUES (p.id, kind, p.status, p.version, p.runtime_class, p.operators);
    RETURN NULL;
END $$
"""

_NOTIFY = """
CREATE FUNCTION berth_watch_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('berth_watch', '');
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "task_events",
        sa.Column("xid", sa.BigInteger(), nullable=False, server_default=sa.text(XID)),
    )
    op.create_table(
        "pool_events",
        sa.Column("id", sa.BigInteger(), nullable=False,
                  server_default=sa.text("nextval('task_events_id_seq'::regclass)")),
        sa.Column("xid", sa.BigInteger(), nullable=False, server_default=sa.text(XID)),
        sa.Column("pool_id", ID, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("runtime_class", sa.Text(), nullable=False),
        sa.Column("operators", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pool_events"),
    )
    op.create_index("ix_pool_events_xid", "pool_events", ["xid"])
    op.create_index("ix_pool_events_at", "pool_events", ["at"])
    op.create_index(
        "ix_task_events_id_xid", "task_events", ["id", "xid"], postgresql_using="brin",
        postgresql_with={"pages_per_range": 16, "autosummarize": "on"},
    )
    op.execute(_POOL_LOG)
    op.execute(
        "CREATE TRIGGER pools_log AFTER INSERT OR UPDATE OR DELETE ON pools "
        "FOR EACH ROW EXECUTE FUNCTION berth_pool_log()"
    )
    op.execute(_NOTIFY)
    for table in ("task_events", "pool_events"):
        op.execute(
            f"CREATE TRIGGER {table}_notify AFTER INSERT ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION berth_watch_notify()"
        )


def downgrade() -> None:
    for table in ("task_events", "pool_events"):
        op.execute(f"DROP TRIGGER {table}_notify ON {table}")
    op.execute("DROP FUNCTION berth_watch_notify()")
    op.execute("DROP TRIGGER pools_log ON pools")
    op.execute("DROP FUNCTION berth_pool_log()")
    op.drop_index("ix_task_events_id_xid", table_name="task_events")
    op.drop_table("pool_events")
    op.drop_column("task_events", "xid")
