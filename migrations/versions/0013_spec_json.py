"""``tasks.spec`` is ``json``: the text the API validated, returned by a claim as it is.

Every pass reads its claimed tasks' specs as text (``spec::text`` in the claim, the
compile cache's key). Stored as ``jsonb``, each read rebuilt the text from the binary
document (``jsonb_out``): 19.1 M of the claim statement's 54.6 M instructions in a
replayed pass of 1,024 placements at 1,000 pools (callgrind, private cluster), about
18.6 K instructions per placement. ``json`` keeps the text as written: the claim copies
it. The few reads that look inside (``spec -> 'requests'`` of the heartbeat lease list and
of preemption victims) work on ``json`` as they did on ``jsonb``. Decision 13 says what
changes and what guards the spec instead.

Revision ID: 0013_spec_json
Revises: 0012_placement_text
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013_spec_json"
down_revision: str | None = "0012_placement_text"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision (rewrites ``tasks``)."""
    op.execute("ALTER TABLE tasks ALTER COLUMN spec TYPE json USING spec::json")


def downgrade() -> None:
    """Revert this revision (rewrites ``tasks``)."""
    op.execute("ALTER TABLE tasks ALTER COLUMN spec TYPE jsonb USING spec::jsonb")
