"""``tasks.placement`` is ``text``: the JSON the reconciler wrote, stored without parsing it.

Revision 0010_pg made the column ``json`` (validated, not rebuilt as ``jsonb``). Validating
600 bytes of JSON per lease was about 18.8 M of a replayed pass's 331.3 M instructions in the
lease statement (1,024 placements, 1,000 pools, callgrind). The reconciler writes the
document with orjson (always valid JSON) and reads return it as written, so the server's
parse checked nothing that could fail. Decision 11 says what guards the document instead.

Revision ID: 0012_placement_text
Revises: 0011_events
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012_placement_text"
down_revision: str | None = "0011_events"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.execute("ALTER TABLE tasks ALTER COLUMN placement TYPE text USING placement::text")


def downgrade() -> None:
    """Revert this revision."""
    op.execute("ALTER TABLE tasks ALTER COLUMN placement TYPE json USING placement::json")
