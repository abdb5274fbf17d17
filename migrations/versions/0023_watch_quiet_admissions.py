"""The watch feed's trigger no longer notifies for admissions.

``NOTIFY`` in a transaction serializes its commit with every other notifying commit of the
database (PostgreSQL takes one lock for the notification queue until the commit is
flushed). The statement trigger on ``task_events`` notified ``berth_watch`` for every
submission, so submissions committed one at a time. Now it notifies only when the
statement added a row other than an admission (``from_state`` set): placements, revocations,
ends. Admissions reach the watch hubs by the reconciler wakeup the submitting process sends
after its commit (coalesced, one at a time), which the hubs also listen to, and at the
latest by the hub's one-second read.

Revision ID: 0023_watch_quiet_admissions
Revises: 0022_fair_usage
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0023_watch_quiet_admissions"
down_revision: str | None = "0022_fair_usage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NOTIFY_CHANGES = """
CREATE FUNCTION berth_watch_notify_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM added WHERE from_state IS NOT NULL) THEN
        PERFORM pg_notify('berth_watch', '');
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER task_events_notify ON task_events")
    op.execute(_NOTIFY_CHANGES)
    op.execute(
        "CREATE TRIGGER task_events_notify AFTER INSERT ON task_events "
        "REFERENCING NEW TABLE AS added "
        "FOR EACH STATEMENT EXECUTE FUNCTION berth_watch_notify_changes()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER task_events_notify ON task_events")
    op.execute("DROP FUNCTION berth_watch_notify_changes()")
    op.execute(
        "CREATE TRIGGER task_events_notify AFTER INSERT ON task_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION berth_watch_notify()"
    )
