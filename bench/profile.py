"""``berth bench e2e --profile-out DIR``: where a run's CPU and writes go.

* **The reconcilers' CPU by phase of the pass.** Every pass log line carries the reconciler
  thread's CPU per phase (``cpu_<phase>_ms``, :mod:`app.cpu_phases`): ``claim``, ``read``
  (specs, snapshot, quota rows, holds), ``plan`` (the decisions), ``displace`` (the
  displacement planners), ``commit_build`` (rows and documents built for the commit's
  statements), ``commit`` (the statements, through the driver) and ``record`` (the pass
  record). The bench sums them over every pass of every reconciler; ``other`` is what the
  reconciler processes used outside any pass (the event loop, logs, the listener).
  Every run reports these (``passCpuUsPerPlacement``); the profile writes them as a table.
* **PostgreSQL's time per statement** (``pg_stat_statements`` of the run's database, reset
  as admission starts): calls, rows, execution and planning time, WAL bytes. The extension
  must be loaded by the server (``shared_preload_libraries``): the embedded PostgreSQL a
  profiled run starts loads it; a ``--server-url`` server that does not is named in the
  output (``statements.unavailable``) and the rest of the profile is written anyway.
* **Index entries per placement**: the live items on the leaf pages of every B-tree index
  of the tables a placement writes (``pageinspect``), before admission and after the last
  lease; like the WAL, the difference includes the admission's own entries (each admitted
  task's row and event), which do not change with the reconcilers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import orjson

__all__ = [
    "PHASES",
    "PRELOAD",
    "ProfileStart",
    "phases_per_placement",
    "profile_collect",
    "profile_statements",
    "profile_wal",
    "profile_start",
    "profile_write",
]

#: The server setting a profiled run's embedded PostgreSQL starts with.
PRELOAD = "shared_preload_libraries=pg_stat_statements"
#: The phases of a pass, in order (:mod:`app.cpu_phases`).
PHASES = ("claim", "read", "plan", "displace", "commit_build", "commit", "record")
#: Statements the profile lists, by total time, and how much of each one's text.
STATEMENTS_TOP = 25
QUERY_CHARS = 4000
#: Characters of a statement's text in profile.md.
QUERY_SHOWN = 160


@dataclass(frozen=True, slots=True)
class ProfileStart:
    """What the profile saw as admission started."""

    #: The WAL position as admission started (None: pg_walinspect is not available).
    wal_start: int | None

    #: Why pg_stat_statements cannot be read (None: it can, and was reset).
    statements_unavailable: str | None
    #: Index entries of each index (None: pageinspect is not available).
    indexes: dict[str, int] | None
    indexes_unavailable: str | None


async def _statements_prepare(conn: asyncpg.Connection) -> str | None:
    """Create pg_stat_statements in the run's database and reset its figures there; return
    why that is impossible (None: done)."""
    preload = await conn.fetchval("SELECT current_setting('shared_preload_libraries')")
    if "pg_stat_statements" not in preload:
        return ("the server does not load pg_stat_statements (shared_preload_libraries); "
                "profile on the embedded PostgreSQL (no --server-url) or on a server that "
                "loads it")
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database "
            "WHERE datname = current_database()), 0)")
    except asyncpg.PostgresError as exc:
        return f"pg_stat_statements cannot be used: {exc}"
    return None


# Heap tuples each B-tree index of the tables $1 points at: the items of its leaf pages that
# are not marked dead, a posting list (deduplicated entries) counting each of its tuples, the
# high key (no heap tuple) none. Page 0 is the metapage.
_INDEX_ENTRIES = """
SELECT t.relname || '.' || c.relname AS name,
       (SELECT coalesce(sum(CASE WHEN it.htid IS NULL THEN 0
                                 ELSE coalesce(cardinality(it.tids), 1) END), 0)
        FROM generate_series(1, pg_relation_size(c.oid) / current_setting('block_size')::int - 1)
             AS b,
             LATERAL bt_page_stats(c.oid::regclass::text, b) AS s,
             LATERAL bt_page_items(c.oid::regclass::text, b) AS it
        WHERE s.type = 'l' AND NOT it.dead) AS n
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_am a ON a.oid = c.relam
WHERE t.relname = ANY($1::text[]) AND a.amname = 'btree'
"""


async def _index_entries(conn: asyncpg.Connection, tables: list[str]) -> dict[str, int]:
    return {r["name"]: int(r["n"]) for r in await conn.fetch(_INDEX_ENTRIES, tables)}


async def profile_start(conn: asyncpg.Connection, tables: list[str]) -> ProfileStart:
    """Prepare the profile of the run in ``conn``'s database, just before admission."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        indexes: dict[str, int] | None = await _index_entries(conn, tables)
        why = None
    except asyncpg.PostgresError as exc:
        indexes, why = None, f"pageinspect cannot be used: {exc}"
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        wal_start = await conn.fetchval("SELECT pg_current_wal_flush_lsn()")
    except asyncpg.PostgresError:
        wal_start = None
    return ProfileStart(wal_start, await _statements_prepare(conn), indexes, why)


# The WAL written since $1 by record type (server-wide), largest first. PostgreSQL 15
# refuses an end past the flushed position, so both ends are flushed positions.
_WAL_STATS = """
SELECT "resource_manager/record_type" AS kind, count, record_size, fpi_size
FROM pg_get_wal_stats($1::pg_lsn, pg_current_wal_flush_lsn(), true)
WHERE count > 0 ORDER BY combined_size DESC LIMIT 12
"""


async def profile_wal(conn: asyncpg.Connection, start: ProfileStart,
                      placements: int) -> dict[str, Any]:
    """Return the WAL records, bytes and full-page-image bytes per placement since
    admission began, by record type (call it as the last task is leased)."""
    if start.wal_start is None:
        return {"unavailable": "pg_walinspect cannot be used"}
    try:
        rows = await conn.fetch(_WAL_STATS, start.wal_start)
    except asyncpg.PostgresError as exc:
        return {"unavailable": f"pg_walinspect could not read the WAL: {exc}"}
    return {r["kind"]: {"records": round(r["count"] / placements, 2),
                        "bytes": round(r["record_size"] / placements, 1),
                        "fpiBytes": round(r["fpi_size"] / placements, 1)} for r in rows}


_STATEMENTS = """
SELECT query, calls, rows, total_exec_time, total_plan_time, wal_bytes, wal_records,
       shared_blks_hit + shared_blks_read AS blocks, shared_blks_dirtied AS dirtied
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time + total_plan_time DESC
"""


async def _statements(conn: asyncpg.Connection, placements: int) -> dict[str, Any]:
    rows = await conn.fetch(_STATEMENTS)
    total = sum(r["total_exec_time"] + r["total_plan_time"] for r in rows) or 1.0
    out = []
    for r in rows[:STATEMENTS_TOP]:
        ms = r["total_exec_time"] + r["total_plan_time"]
        out.append({
            "query": " ".join(r["query"].split())[:QUERY_CHARS],
            "calls": r["calls"], "rows": r["rows"],
            "totalMs": round(ms, 1), "share": round(ms / total, 3),
            "planMs": round(r["total_plan_time"], 1),
            "usPerPlacement": round(1000 * ms / placements, 2),
            "walBytesPerPlacement": round(float(r["wal_bytes"]) / placements, 1),
            "blocks": r["blocks"], "dirtied": r["dirtied"],
        })
    return {"totalMs": round(total, 1),
            "walBytesPerPlacement": round(sum(float(r["wal_bytes"]) for r in rows)
                                          / placements, 1),
            "top": out}


async def profile_statements(conn: asyncpg.Connection, start: ProfileStart,
                             placements: int) -> dict[str, Any]:
    """Return PostgreSQL's figures per statement since admission began (call it once every
    task is leased, before anything else runs in the database)."""
    if start.statements_unavailable is not None:
        return {"unavailable": start.statements_unavailable}
    return await _statements(conn, placements)


async def profile_collect(conn: asyncpg.Connection, start: ProfileStart,
                          tables: list[str], placements: int) -> dict[str, Any]:
    """Return the index entries and updates of the profile, once every task is leased and
    the reconcilers have stopped."""
    out: dict[str, Any] = {}
    if start.indexes is not None:
        after = await _index_entries(conn, tables)
        added = {k: v - start.indexes.get(k, 0) for k, v in sorted(after.items())}
        out["indexEntriesPerPlacement"] = round(sum(added.values()) / placements, 2)
        out["indexEntries"] = {k: round(v / placements, 2) for k, v in added.items() if v}
    else:
        out["indexEntriesPerPlacement"] = None
        out["indexEntries"] = {"unavailable": start.indexes_unavailable}
    hot = await conn.fetch(
        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE relname = ANY($1::text[])", tables)
    out["updates"] = {r["relname"]: {"rows": r["n_tup_upd"], "hot": r["n_tup_hot_upd"]}
                      for r in hot if r["n_tup_upd"]}
    return out


def phases_per_placement(cpu_ms: dict[str, float], reconcilers_seconds: float,
                         placements: int) -> dict[str, float]:
    """Return the reconcilers' CPU µs per placement by phase, ``other`` (outside every pass)
    and ``total``."""
    out = {p: round(1000 * cpu_ms.get(p, 0.0) / placements, 1) for p in PHASES}
    total = 1e6 * reconcilers_seconds / placements
    out["other"] = round(total - sum(out.values()), 1)
    out["total"] = round(total, 1)
    return out


def _phase_table(result: dict[str, Any]) -> list[str]:
    phases = result["passCpuUsPerPlacement"]
    total = phases["total"] or 1.0
    lines = ["| phase | reconciler CPU µs per placement | share |", "| --- | --- | --- |"]
    for name, us in phases.items():
        if name != "total":
            lines.append(f"| {name} | {us} | {100 * us / total:.0f} % |")
    lines.append(f"| **reconcilers** | **{phases['total']}** | |")
    pg = result["cpuSeconds"]["postgres"]
    lines.append(f"| PostgreSQL (its processes serving the run) | "
                 f"{round(1e6 * pg / result['tasks'], 1)} | |")
    return lines


def _statement_table(statements: dict[str, Any]) -> list[str]:
    if "unavailable" in statements:
        return [f"pg_stat_statements unavailable: {statements['unavailable']}"]
    lines = ["| share | µs per placement | calls | rows | WAL B per placement | statement |",
             "| --- | --- | --- | --- | --- | --- |"]
    for s in statements["top"]:
        query = s["query"][:QUERY_SHOWN].replace("|", "\\|")
        lines.append(f"| {100 * s['share']:.1f} % | {s['usPerPlacement']} | {s['calls']} | "
                     f"{s['rows']} | {s['walBytesPerPlacement']} | `{query}` |")
    return lines


def profile_write(directory: str, result: dict[str, Any]) -> None:
    """Write ``profile.json`` (the run's result) and ``profile.md`` (its tables) into
    ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    profile = result["profile"]
    lines = [
        f"# berth bench e2e profile: {result['pools']} pools, {result['tasks']} tasks, "
        f"{result['reconcilers']} reconcilers, load {result['loadAverage1m']}", "",
        *_phase_table(result), "",
        f"WAL per placement: {result['walKiBPerPlacement']} KiB (server-wide); index entries "
        f"per placement (admission included): {profile['indexEntriesPerPlacement']}", "",
        *(f"- {k}: {v}" for k, v in profile["indexEntries"].items()), "",
        f"Row updates (HOT): {profile['updates']}", "",
        "WAL per placement by record type (records, bytes, full-page-image bytes):", "",
        *(f"- {k}: {v}" for k, v in profile["wal"].items()), "",
        *_statement_table(profile["statements"]), "",
    ]
    (out / "profile.md").write_text("\n".join(lines))
