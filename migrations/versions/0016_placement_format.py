"""Every stored placement is in one format, version 2: a JSON array led by its version.

Until this revision a placement was stored in one of two forms, told apart by JSON type: a
document object (``{"poolId", "score", "components", "members", "alternatives"}``, plus
``walkedFrom`` after a walk) or a lean array ``[1, pool ids, scores, components]``. Both are
rewritten as::

    [2, [chosen pool, alternative, ...], [score, ...], [[name, value, reason], ...],
     [[pool, count], ...], [walked-from pool, ...]]

(``app.scheduling.explain`` writes and renders it). Numbers are copied as written. A stored
value that names no pool (JSON ``null``, an object without ``poolId``) was served as no
placement and becomes SQL ``NULL``.

The rows are rewritten in batches of :data:`BATCH` tasks in primary-key order, each batch one
statement on an index range, so no statement reads or rewrites the whole table. The table is
not locked as a whole (no ``ALTER TABLE``); the rows rewritten stay locked until the migration
commits. A downgrade writes the document form back (numbers rounded to 4 places).

Revision ID: 0016_placement_format
Revises: 0015_tokens_coalescing
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_placement_format"
down_revision: str | None = "0015_tokens_coalescing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Tasks read per batch.
BATCH = 5000

_FIRST_ID = "00000000-0000-0000-0000-000000000000"

# Each function takes a stored placement's text and returns its text in the other format.
_TO_V2 = """
CREATE FUNCTION pg_temp.berth_placement_v2(stored text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN json_typeof(j) = 'array' THEN json_build_array(
      2,
      j->1,
      j->2,
      j->3,
      json_build_array(json_build_array(j->1->0, 1)),
      '[]'::json)::text
    WHEN json_typeof(j) = 'object' AND j->'poolId' IS NOT NULL THEN json_build_array(
      2,
      (SELECT json_agg(p ORDER BY i) FROM (
         SELECT j->'poolId', 0
         UNION ALL
         SELECT a->'poolId', i FROM json_array_elements(
           coalesce(j->'alternatives', '[]')) WITH ORDINALITY AS x(a, i)) AS s(p, i)),
      (SELECT json_agg(coalesce(sc, '0'::json) ORDER BY i) FROM (
         SELECT j->'score', 0
         UNION ALL
         SELECT a->'score', i FROM json_array_elements(
           coalesce(j->'alternatives', '[]')) WITH ORDINALITY AS x(a, i)) AS s(sc, i)),
      (SELECT coalesce(json_agg(json_build_array(
                c->'name', c->'value', coalesce(c->'reason', '""'::json)) ORDER BY i), '[]')
       FROM json_array_elements(coalesce(j->'components', '[]')) WITH ORDINALITY AS x(c, i)),
      coalesce(
        (SELECT json_agg(json_build_array(m->'poolId', m->'count') ORDER BY i)
         FROM json_array_elements(coalesce(j->'members', '[]')) WITH ORDINALITY AS x(m, i)),
        json_build_array(json_build_array(j->'poolId', 1))),
      coalesce(j->'walkedFrom', '[]'))::text
  END
  FROM (SELECT stored::json AS j) AS s
$$
"""

_TO_DOCUMENT = """
CREATE FUNCTION pg_temp.berth_placement_document(stored text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT (json_build_object(
      'poolId', j->1->0,
      'score', round((j->2->>0)::numeric, 4),
      'components', (SELECT coalesce(json_agg(json_build_object(
                       'name', c->0, 'value', round((c->>1)::numeric, 4), 'reason', c->2)
                       ORDER BY i), '[]')
                     FROM json_array_elements(j->3) WITH ORDINALITY AS x(c, i)),
      'members', (SELECT coalesce(json_agg(json_build_object(
                    'poolId', m->0, 'count', m->1) ORDER BY i), '[]')
                  FROM json_array_elements(j->4) WITH ORDINALITY AS x(m, i)),
      'alternatives', (SELECT coalesce(json_agg(json_build_object(
                         'poolId', p, 'score', round((j->2->>(i::int - 1))::numeric, 4))
                         ORDER BY i), '[]')
                       FROM json_array_elements(j->1) WITH ORDINALITY AS x(p, i)
                       WHERE i > 1))::jsonb
      || CASE WHEN json_array_length(j->5) > 0
              THEN jsonb_build_object('walkedFrom', j->5) ELSE '{}' END)::text
  FROM (SELECT stored::json AS j) AS s
$$
"""

# One batch: the next BATCH tasks after :after by id, rewritten where they hold a placement
# not yet in the target form; returns the last id of the batch (NULL: no task left).
_BATCH = """
WITH batch AS (
  SELECT id FROM tasks WHERE id > CAST(:after AS uuid) ORDER BY id LIMIT :n
), rewritten AS (
  UPDATE tasks t SET placement = {function}(t.placement)
    FROM batch b
   WHERE t.id = b.id AND t.placement IS NOT NULL AND {pending}
)
SELECT max(id::text) FROM batch
"""

_V2 = "json_typeof(t.placement::json) = 'array' AND t.placement::json->>0 = '2'"
_NOT_V2 = f"NOT ({_V2})"


def _rewrite(function_sql: str, function: str, pending: str) -> None:
    bind = op.get_bind()
    bind.execute(sa.text(function_sql))
    statement = sa.text(_BATCH.format(function=function, pending=pending))
    after: str | None = _FIRST_ID
    while after is not None:
        after = bind.execute(statement, {"after": after, "n": BATCH}).scalar()
    bind.execute(sa.text(f"DROP FUNCTION {function}(text)"))


def upgrade() -> None:
    """Apply this revision (rewrites the placements of ``tasks`` in batches)."""
    _rewrite(_TO_V2, "pg_temp.berth_placement_v2", _NOT_V2)


def downgrade() -> None:
    """Revert this revision (rewrites the placements of ``tasks`` in batches)."""
    _rewrite(_TO_DOCUMENT, "pg_temp.berth_placement_document", _V2)
