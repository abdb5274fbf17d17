"""Cohort trees: cohorts an admin configured (parent, fair weight, quotas of their own),
and per managed (runtime class, resource) a row per cohort of the tree with its cap, what it
lends to its parent, its limit and what its members draw on it; ``quota_tree_draw`` moves
those rows up a path in one fixed lock order.

Revision ID: 0021_cohort_trees
Revises: 0020_pass_records
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_cohort_trees"
down_revision: str | None = "0020_pass_records"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.Text(collation="C")
#: The name revision 0017_tenant_quotas gave the check (the naming convention applied twice).
_BORROWED_CHECK = "ck_cohort_usage_ck_cohort_usage_borrowed_nonnegative"

# Move the cohort rows of each unit (a tenant's placement in one class, all of its
# resources; entries sorted by unit): for entry i, draw p_draw[i] on the row (p_cohort[i],
# p_class[i], p_resource[i]) and on up its path, each row's draw on its parent being
# max(0, used - (cap - lend)) before and after. p_more[i] is the borrowed part of the draw.
# Every row on the paths is locked first, deepest first (depth desc, then key), the one
# order of every writer of these rows. Then the units that borrow nothing (never refused)
# move the rows level by level, deepest first, one UPDATE per level for all of them. Then
# each unit that borrows walks its paths: while some of the draw remains borrowed (past the
# rows' caps), a row refuses to go above its lim; a refused unit's rows are put back and
# its number returned.
QUOTA_TREE_DRAW = """
CREATE FUNCTION quota_tree_draw(p_unit int[], p_cohort text[], p_class text[],
    p_resource text[], p_draw bigint[], p_more bigint[]) RETURNS SETOF int
LANGUAGE plpgsql AS $$
DECLARE
  n int := coalesce(cardinality(p_unit), 0);
  i int; u int; cur text; d bigint; m bigint; ok boolean; r record; dep int;
  cond int[];
  pc text[]; prc text[]; pres text[]; pd bigint[];
  undo_c text[]; undo_rc text[]; undo_res text[]; undo_d bigint[];
BEGIN
  IF n = 0 THEN RETURN; END IF;
  PERFORM 1 FROM cohort_usage c WHERE (c.cohort, c.runtime_class, c.resource) IN (
    WITH RECURSIVE p(cohort, rc, res) AS (
      SELECT x.c COLLATE "C", x.rc COLLATE "C", x.res
      FROM unnest(p_cohort, p_class, p_resource) AS x(c, rc, res)
      UNION
      SELECT c.parent, p.rc, p.res FROM p JOIN cohort_usage c
        ON (c.cohort, c.runtime_class, c.resource) = (p.cohort, p.rc, p.res)
      WHERE c.parent IS NOT NULL)
    SELECT cohort, rc, res FROM p)
  ORDER BY c.depth DESC, c.cohort, c.runtime_class, c.resource FOR UPDATE;
  SELECT coalesce(array_agg(DISTINCT p_unit[k]), '{}') INTO cond
  FROM generate_subscripts(p_unit, 1) AS k WHERE p_more[k] > 0;
  SELECT array_agg(x.c), array_agg(x.rc), array_agg(x.res), array_agg(x.d)
  INTO pc, prc, pres, pd FROM (
    SELECT p_cohort[k] AS c, p_class[k] AS rc, p_resource[k] AS res,
      sum(p_draw[k])::bigint AS d
    FROM generate_subscripts(p_unit, 1) AS k WHERE NOT p_unit[k] = ANY(cond)
    GROUP BY 1, 2, 3 HAVING sum(p_draw[k]) <> 0) x;
  WHILE pc IS NOT NULL LOOP
    SELECT max(c.depth) INTO dep FROM cohort_usage c
    JOIN unnest(pc, prc, pres) AS v(c, rc, res)
      ON (c.cohort, c.runtime_class, c.resource) = (v.c, v.rc, v.res);
    EXIT WHEN dep IS NULL;
    WITH v AS (SELECT * FROM unnest(pc, prc, pres, pd) AS v(c, rc, res, d)),
    moved AS (
      UPDATE cohort_usage c SET used = c.used + v.d FROM v
      WHERE (c.cohort, c.runtime_class, c.resource) = (v.c, v.rc, v.res) AND c.depth = dep
      RETURNING c.parent AS c, c.runtime_class AS rc, c.resource AS res,
        greatest(0, c.used - (c.cap - c.lend))
          - greatest(0, c.used - v.d - (c.cap - c.lend)) AS d),
    rest AS (
      SELECT v.c, v.rc, v.res, v.d FROM v JOIN cohort_usage c
        ON (c.cohort, c.runtime_class, c.resource) = (v.c, v.rc, v.res)
      WHERE c.depth < dep),
    nxt AS (SELECT * FROM moved WHERE c IS NOT NULL UNION ALL SELECT * FROM rest)
    SELECT array_agg(x.c), array_agg(x.rc), array_agg(x.res), array_agg(x.d)
    INTO pc, prc, pres, pd FROM (
      SELECT nxt.c, nxt.rc, nxt.res, sum(nxt.d)::bigint AS d FROM nxt
      GROUP BY 1, 2, 3 HAVING sum(nxt.d) <> 0) x;
  END LOOP;
  u := NULL; ok := true;
  FOR i IN 1..n LOOP
    CONTINUE WHEN NOT p_unit[i] = ANY(cond);
    IF u IS DISTINCT FROM p_unit[i] THEN
      IF NOT ok THEN
        UPDATE cohort_usage c SET used = c.used - v.d
        FROM unnest(undo_c, undo_rc, undo_res, undo_d) AS v(c, rc, res, d)
        WHERE (c.cohort, c.runtime_class, c.resource) = (v.c, v.rc, v.res);
        RETURN NEXT u;
      END IF;
      u := p_unit[i]; ok := true;
      undo_c := '{}'; undo_rc := '{}'; undo_res := '{}'; undo_d := '{}';
    END IF;
    CONTINUE WHEN NOT ok;
    cur := p_cohort[i]; d := p_draw[i]; m := p_more[i];
    WHILE cur IS NOT NULL AND d <> 0 LOOP
      UPDATE cohort_usage c SET used = c.used + d
      WHERE c.cohort = cur AND c.runtime_class = p_class[i] AND c.resource = p_resource[i]
        AND (m <= 0 OR c.lim IS NULL OR c.used + d <= c.lim)
      RETURNING c.parent,
        greatest(0, c.used - (c.cap - c.lend)) - greatest(0, c.used - d - (c.cap - c.lend))
          AS nd,
        least(m, greatest(0, c.used - c.cap) - greatest(0, c.used - d - c.cap)) AS nm
      INTO r;
      IF NOT FOUND THEN
        ok := m <= 0;
        EXIT;
      END IF;
      undo_c := undo_c || cur; undo_rc := undo_rc || p_class[i];
      undo_res := undo_res || p_resource[i]; undo_d := undo_d || d;
      cur := r.parent; d := r.nd; m := r.nm;
    END LOOP;
  END LOOP;
  IF NOT ok THEN
    UPDATE cohort_usage c SET used = c.used - v.d
    FROM unnest(undo_c, undo_rc, undo_res, undo_d) AS v(c, rc, res, d)
    WHERE (c.cohort, c.runtime_class, c.resource) = (v.c, v.rc, v.res);
    RETURN NEXT u;
  END IF;
END $$
"""

# The flat rows again under the tree's rules: each cohort a root pooling what its tenants
# lend, its members drawing their usage above what they keep.
_FLAT_REBUILD = """
INSERT INTO cohort_usage (cohort, runtime_class, resource, depth, cap, lend, lim, used)
SELECT cohort, runtime_class, resource, 0, s.cap, s.cap, s.cap, s.used FROM (
  SELECT cohort, runtime_class, resource, sum(coalesce(lend, nominal)) AS cap,
    sum(greatest(0, used - (nominal - coalesce(lend, nominal)))) AS used
  FROM quota_usage GROUP BY 1, 2, 3) s
"""


def upgrade() -> None:
    op.create_table(
        "cohorts",
        sa.Column("id", ID, nullable=False),
        sa.Column("parent", ID),
        sa.Column("fair_weight", sa.Float(), nullable=False, server_default="1"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("id", name="pk_cohorts"),
        sa.CheckConstraint("fair_weight BETWEEN 0.001 AND 1000",
                           name="fair_weight_range"),
        sa.CheckConstraint("parent IS NULL OR parent <> id", name="parent_not_self"),
    )
    op.create_index("ix_cohorts_parent", "cohorts", ["parent"])
    op.create_table(
        "cohort_quotas",
        sa.Column("cohort_id", ID, nullable=False),
        sa.Column("runtime_class", ID, nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("nominal", sa.BigInteger(), nullable=False),
        sa.Column("borrowing_limit", sa.BigInteger()),
        sa.Column("lending_limit", sa.BigInteger()),
        sa.PrimaryKeyConstraint("cohort_id", "runtime_class", "resource",
                                name="pk_cohort_quotas"),
        sa.ForeignKeyConstraint(["cohort_id"], ["cohorts.id"], ondelete="CASCADE",
                                name="fk_cohort_quotas_cohort_id_cohorts"),
        sa.CheckConstraint("resource IN ('cpuMillis', 'memoryMiB', 'llmSlots')",
                           name="resource_known"),
        sa.CheckConstraint(
            "nominal >= 0 AND (borrowing_limit IS NULL OR borrowing_limit >= 0) "
            "AND (lending_limit IS NULL OR lending_limit >= 0)",
            name="amounts_valid",
        ),
    )
    op.create_index("ix_cohort_quotas_runtime_class", "cohort_quotas", ["runtime_class"])
    op.execute("DELETE FROM cohort_usage")
    op.drop_constraint(op.f(_BORROWED_CHECK), "cohort_usage", type_="check")
    op.alter_column("cohort_usage", "borrowed", new_column_name="used")
    op.add_column("cohort_usage", sa.Column("parent", ID))
    op.add_column("cohort_usage", sa.Column("depth", sa.Integer(), nullable=False,
                                            server_default="0"))
    op.add_column("cohort_usage", sa.Column("nominal", sa.BigInteger(), nullable=False,
                                            server_default="0"))
    op.add_column("cohort_usage", sa.Column("cap", sa.BigInteger(), nullable=False,
                                            server_default="0"))
    op.add_column("cohort_usage", sa.Column("lend", sa.BigInteger(), nullable=False,
                                            server_default="0"))
    op.add_column("cohort_usage", sa.Column("lim", sa.BigInteger()))
    op.create_check_constraint(op.f("ck_cohort_usage_used_nonnegative"), "cohort_usage",
                               "used >= 0")
    op.create_check_constraint(op.f("ck_cohort_usage_lend_within_cap"), "cohort_usage",
                               "lend BETWEEN 0 AND cap")
    op.execute(_FLAT_REBUILD)
    op.execute(QUOTA_TREE_DRAW)


def downgrade() -> None:
    op.execute("DROP FUNCTION quota_tree_draw(int[], text[], text[], text[], bigint[], "
               "bigint[])")
    op.execute("DELETE FROM cohort_usage")
    op.drop_constraint(op.f("ck_cohort_usage_lend_within_cap"), "cohort_usage", type_="check")
    op.drop_constraint(op.f("ck_cohort_usage_used_nonnegative"), "cohort_usage", type_="check")
    for column in ("lim", "lend", "cap", "nominal", "depth", "parent"):
        op.drop_column("cohort_usage", column)
    op.alter_column("cohort_usage", "used", new_column_name="borrowed")
    op.create_check_constraint(op.f(_BORROWED_CHECK), "cohort_usage",
                               "borrowed >= 0")
    op.execute(
        "INSERT INTO cohort_usage (cohort, runtime_class, resource, borrowed) "
        "SELECT cohort, runtime_class, resource, sum(greatest(0, used - nominal)) "
        "FROM quota_usage GROUP BY 1, 2, 3"
    )
    op.drop_table("cohort_quotas")
    op.drop_table("cohorts")
