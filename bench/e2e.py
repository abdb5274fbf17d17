"""``berth bench e2e``: reconcilers against a fresh database until every task is leased.

One run, on one PostgreSQL server (``--server-url``, else ``BERTH_DATABASE_URL``, else an
embedded PostgreSQL started for the run):

1. generate P pools and T tasks (:mod:`bench.dataset`), create a fresh database, migrate
   it (``berth migrate``), COPY the pools, ledgers and runtime heartbeats, and stage the
   tasks;
2. start R reconciler processes (``berth reconcile --shard i/R``, durable commits) and wait
   until each listens for wakeups;
3. admit every task in one transaction (``admitted_at = now()``, one ``submitted`` wakeup),
   keep the runtimes heartbeating, sample each reconciler's RSS, and poll until every task
   is ``LEASED``; then stop the reconcilers and check the ledger invariants;
4. unless ``--skip-naive``, load the identical dataset into a second fresh database and time
   the naive baseline (:mod:`bench.naive`) with R workers on ``min(T, --naive-tasks)`` tasks;
5. unless ``--skip-floor``, load it into a third and time the SQL floor on Berth's schema
   (:mod:`bench.floor`) on all T tasks: ``fractionOfFloor`` = placementsPerSec /
   floorPlacementsPerSec;
6. unless ``--skip-minimal-floor``, time the minimal SQL floor (:mod:`bench.minimal_floor`)
   on its own tables in a fourth, with the same T tasks, P pools and anchors:
   ``fractionOfMinimalFloor`` = placementsPerSec / minimalFloorPlacementsPerSec;
7. unless ``--skip-peer`` (or pgqueuer is not installed), move T jobs through pgqueuer in a
   fifth (:mod:`bench.peer`): ``ratioVsPeer`` = placementsPerSec / peerJobsPerSec;
8. print a short table of the headline figures (with ``--json``, ONE JSON line; either way
   the phases show on stderr while they run). ``placementsPerSec`` = T / (wall time from
   the admission's commit to the poll that saw the last task leased), as every baseline's
   clock starts with its tasks admitted or its jobs enqueued
   (``placementsPerSecWithAdmission`` counts from the start of the admission transaction);
   lease latencies come from ``leased_at - admitted_at`` in the database (``admitted_at`` is
   the admission transaction's start); ``cpuMsPerPlacement`` is the CPU of the
   reconcilers and of PostgreSQL's processes serving the run's database, per placement.

``--sweep pools=1000,5000 reconcilers=1,2,4 --chart docs/img/bench-e2e.png`` runs every
combination (baselines skipped, except the minimal SQL floor: it takes a few seconds and
gives each point a yardstick measured beside it), prints one JSON line each, and draws the
chart.

``--repeat N`` (without ``--sweep``) runs the whole side by side N times, prints each run, and
ends with the median and range over the runs of the headline figures and of each ratio to
a baseline (:func:`repeat_summary`).

``--mix antiaffinity|gangs`` swaps 10% of the tasks for required anti-affinity or gangs;
``--finished N`` preloads N finished tasks with their events and ended leases into the
reconcilers' database first (:mod:`bench.history`), to show what history costs a pass
(``passPhasesMs``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psutil

from app.compiled import active as compiled_active
from app.config import Settings
from app.ledger.cohorts import cohort_put
from app.ledger.invariants import ledger_check
from app.ledger.tenants import Quota, tenant_put
from bench.database import (
    SERVER_HELP,
    bench_connect,
    database_name,
    env_server_url,
    postgres_server,
    scratch_database,
)
from bench.dataset import (
    MIXES,
    Dataset,
    dataset_admit,
    dataset_generate,
    dataset_load,
    runtimes_heartbeat,
)
from bench.floor import FLOOR_BATCH, floor_prepare, floor_run
from bench.history import history_load
from bench.minimal_floor import minimal_floor_check, minimal_floor_prepare, minimal_floor_run
from bench.naive import naive_run
from bench.peer import PEER_BATCH, peer_available, peer_prepare, peer_run
from bench.profile import (
    PHASES,
    PRELOAD,
    phases_per_placement,
    profile_collect,
    profile_start,
    profile_statements,
    profile_wal,
    profile_write,
)
from bench.report import Progress, json_option, result_print, table_print
from bench.workers import REPO_ROOT, postgres_cpu_seconds, python_env

__all__ = ["E2EConfig", "e2e_run", "main"]

#: Leases outlive the run: nothing heartbeats leases here, and an expiry mid-run would
#: requeue tasks and measure recovery instead of placement.
LEASE_TTL_SECONDS = 3600.0
HEARTBEAT_EVERY_SECONDS = 5.0
#: How often the bench looks at the logs and the reconcilers' memory while they place. The
#: clock does not depend on it (it stops at the last leasing pass's log time); each look
#: costs CPU the reconcilers and PostgreSQL compete for, and no baseline's parent polls.
POLL_SECONDS = 0.2
COUNT_EVERY_SECONDS = 1.0
#: The resolution of a log line's time (``ts``, whole milliseconds, truncated).
_LOG_TS_RESOLUTION = 0.001


@dataclass(frozen=True, slots=True)
class E2EConfig:
    """One benchmark run's parameters."""

    pools: int = 1000
    tasks: int = 20000
    reconcilers: int = 2
    batch: int | None = None
    server_url: str = ""
    seed: int = 1
    skip_naive: bool = False
    naive_tasks: int = 5000
    stall_seconds: float = 60.0
    ready_timeout_seconds: float = 60.0
    py_spy: str | None = None
    keep_logs: str | None = None
    pg_settings: tuple[tuple[str, str], ...] = ()
    skip_floor: bool = False
    floor_clients: int = 4
    floor_batch: int = FLOOR_BATCH
    skip_minimal_floor: bool = False
    skip_peer: bool = False
    peer_clients: int = 4
    mix: str = "default"
    finished: int = 0
    #: 1: every tenant gets a quota in every runtime class it uses (:func:`_quotas_set`).
    quotas: int = 0
    #: Replay the run's recorded passes with ``berth replay`` before the database goes.
    replay: bool = False
    #: Write the run's profile (:mod:`bench.profile`) into this directory.
    profile_out: str | None = None
    #: Write the run's recorded passes to this file (:func:`bench.plan.records_save`).
    records_out: str | None = None


class BenchFailed(RuntimeError):
    """The benchmark could not finish (a reconciler died, or placement stalled)."""


def _env(url: str, cfg: E2EConfig) -> dict[str, str]:
    env = python_env()
    env["BERTH_DATABASE_URL"] = url
    env["BERTH_LEASE_TTL_SECONDS"] = str(LEASE_TTL_SECONDS)
    # The pass log lines are how the bench follows progress without loading the database.
    env["BERTH_LOG_LEVEL"] = "info"
    if cfg.batch is not None:
        env["BERTH_BATCH_SIZE"] = str(cfg.batch)
    return env


def _start_reconcilers(url: str, cfg: E2EConfig, logdir: Path) -> list[subprocess.Popen]:
    procs = []
    for i in range(cfg.reconcilers):
        log = open(logdir / f"reconciler-{i}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "app.cli", "reconcile", "--shard", f"{i}/{cfg.reconcilers}"],
            env=_env(url, cfg), stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
        ))
        log.close()
    return procs


def _replay(url: str, cfg: E2EConfig) -> dict[str, Any]:
    """Return what ``berth replay --since 10m --json`` says of the run's recorded passes
    (every decision should be identical), with how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", "--since", "10m", "--json"],
        env=_env(url, cfg), capture_output=True, cwd=REPO_ROOT, check=False)
    if done.returncode not in (0, 1):
        raise BenchFailed(f"berth replay failed: {done.stderr.decode()[-500:]}")
    answer = orjson.loads(done.stdout)
    return {"passes": answer["passes"], "decisions": answer["decisions"],
            "identical": answer["identical"], "changed": answer["summary"]["changedTotal"],
            "defects": len(answer["summary"]["defects"]),
            "skipped": len(answer["summary"]["skipped"]),
            "exitStatus": done.returncode,
            "wallSeconds": round(time.monotonic() - started, 1)}


def _stop(procs: list[subprocess.Popen], timeout: float = 15.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _died(procs: list[subprocess.Popen], logdir: Path) -> None:
    for i, p in enumerate(procs):
        if p.poll() is not None:
            tail = (logdir / f"reconciler-{i}.log").read_text(errors="replace")[-2000:]
            raise BenchFailed(f"reconciler {i} exited with status {p.returncode}:\n{tail}")


async def _wait_ready(conn: asyncpg.Connection, procs: list[subprocess.Popen],
                      logdir: Path, limit_seconds: float) -> None:
    """Wait until every reconciler has a connection LISTENing for wakeups."""
    deadline = time.monotonic() + limit_seconds
    while True:
        _died(procs, logdir)
        listening = await conn.fetchval(
            """SELECT count(*) FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND query ILIKE 'LISTEN%'"""
        )
        if listening >= len(procs):
            return
        if time.monotonic() > deadline:
            raise BenchFailed(f"only {listening} of {len(procs)} reconcilers listen after "
                              f"{limit_seconds:.0f} s; see their logs in {logdir}")
        await asyncio.sleep(0.1)


def _spy_start(pid: int, path: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
         "--output", path, "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _cpu_sample(procs: list[subprocess.Popen], database: str,
                own: frozenset[int] = frozenset()) -> dict[str, Any]:
    """Return CPU seconds used so far: per reconciler, per PostgreSQL process serving
    ``database`` but the bench's own backends ``own`` (its polls and checks are no work of
    Berth's), the bench's own (with those backends), and the whole machine's busy time."""
    def used(proc: psutil.Process) -> float:
        t = proc.cpu_times()
        return t.user + t.system

    sample: dict[str, Any] = {"reconcilers": {}, "postgres": {}}
    for p in procs:
        try:
            sample["reconcilers"][p.pid] = used(psutil.Process(p.pid))
        except psutil.Error:
            pass
    server = postgres_cpu_seconds(database)
    sample["postgres"] = {pid: v for pid, v in server.items() if pid not in own}
    sample["bench"] = used(psutil.Process()) + sum(v for pid, v in server.items() if pid in own)
    t = psutil.cpu_times()
    sample["machine"] = t.user + t.nice + t.system + t.irq + t.softirq
    return sample


def _cpu_used(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Return the CPU seconds each group used between two samples."""
    def delta(group: str) -> float:
        return sum(v - before[group].get(pid, 0.0) for pid, v in after[group].items())

    out = {
        "reconcilers": round(delta("reconcilers"), 2),
        "postgres": round(delta("postgres"), 2),
        "bench": round(after["bench"] - before["bench"], 2),
        "machine": round(after["machine"] - before["machine"], 2),
    }
    # Anything else the machine did meanwhile (other processes, other databases' backends):
    # noise in the figures.
    out["other"] = round(out["machine"] - out["reconcilers"] - out["postgres"] - out["bench"], 2)
    return out


class _LogTail:
    """Follow the reconcilers' JSON logs: the tasks their passes leased, and when the last
    pass that leased any logged (``last_at``, seconds since the epoch; None before one)."""

    def __init__(self, paths: list[Path]) -> None:
        self._files = [open(p, "rb") for p in paths]
        self._rest = [b""] * len(paths)
        self.leased = 0
        self.last_at: float | None = None

    def poll(self) -> int:
        """Read what was appended since the last call; return the leased total so far."""
        for i, f in enumerate(self._files):
            chunk = self._rest[i] + f.read()
            *lines, self._rest[i] = chunk.split(b"\n")
            for line in lines:
                if b'"msg":"pass"' not in line:
                    continue
                try:
                    entry = orjson.loads(line)
                    leased = int(entry.get("leased", 0))
                    ts = entry.get("ts") if leased else None
                    at = datetime.fromisoformat(ts).timestamp() if ts else None
                except (orjson.JSONDecodeError, TypeError, ValueError):
                    continue
                self.leased += leased
                if at is not None and (self.last_at is None or at > self.last_at):
                    self.last_at = at
        return self.leased

    def stopped(self, noticed: float, noticed_at: float, total: int) -> float:
        """Return when the last of ``total`` leases committed, on the monotonic clock of
        ``noticed`` (when the bench saw them all, ``noticed_at`` on the wall clock): the log
        time of the last pass that leased, rounded up to its whole millisecond (a pass logs
        after its commit). ``noticed`` itself when the logs do not account for them all, or
        when the two times are further apart than the bench's own count interval allows (the
        wall clock moved)."""
        self.poll()
        if self.leased < total or self.last_at is None:
            return noticed
        lag = noticed_at - (self.last_at + _LOG_TS_RESOLUTION)
        if lag > COUNT_EVERY_SECONDS + 1.0:
            return noticed
        return noticed - max(lag, 0.0)

    def close(self) -> None:
        """Close the files."""
        for f in self._files:
            f.close()


def _rss(procs: list[subprocess.Popen]) -> int:
    peak = 0
    for p in procs:
        try:
            peak = max(peak, psutil.Process(p.pid).memory_info().rss)
        except psutil.Error:
            pass
    return peak


def _log_totals(logdir: Path, count: int) -> dict[str, Any]:
    """Sum the PassResult log lines of the reconcilers: passes, conflicts, claimed, leased,
    errors, and the time spent in each phase of a pass (all reconcilers together)."""
    totals = {"passes": 0, "conflicts": 0, "claimed": 0, "leased": 0, "errors": 0}
    phases = {"claim_ms": 0.0, "snapshot_ms": 0.0, "select_ms": 0.0, "commit_ms": 0.0,
              "duration_ms": 0.0}
    cpu = dict.fromkeys(PHASES, 0.0)
    for i in range(count):
        path = logdir / f"reconciler-{i}.log"
        for line in path.read_bytes().splitlines():
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(entry, dict):
                continue
            if entry.get("level") in ("error", "critical"):
                totals["errors"] += 1
            if "conflicts" not in entry:
                continue
            totals["passes"] += 1
            for key in ("conflicts", "claimed", "leased"):
                value = entry.get(key)
                if isinstance(value, int):
                    totals[key] += value
            for key in phases:
                value = entry.get(key)
                if isinstance(value, int | float):
                    phases[key] += value
            for key in cpu:
                value = entry.get(f"cpu_{key}_ms")
                if isinstance(value, int | float):
                    cpu[key] += value
    return {**totals, "phases": {k.removesuffix("_ms"): round(v, 1) for k, v in phases.items()},
            "cpu": cpu}


async def _latency(conn: asyncpg.Connection) -> dict[str, Any]:
    row = await conn.fetchrow(
        """SELECT count(*) FILTER (WHERE state = 'LEASED') AS leased,
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99,
                  max(ms) AS max
           FROM (SELECT state,
                        extract(epoch FROM leased_at - admitted_at) * 1000 AS ms
                 FROM tasks WHERE state = 'LEASED') t"""
    )
    return {k: (v if k == "leased" or v is None else float(v)) for k, v in dict(row).items()}


#: Teams of the quota tree ``--quotas`` builds: org -> team-0..team-3 -> tenants.
QUOTA_TEAMS = 4


async def _quotas_set(url: str, ds: Dataset) -> None:
    """Give every tenant a quota in every runtime class it uses: nominal = what its tasks
    there request in all (cpu and memory), so every task is admitted within nominal and no
    placement waits for quota; what is measured is the accounting. The tenants sit in a
    tree of three levels (org -> :data:`QUOTA_TEAMS` teams -> tenants) and lend all of
    their nominal, so every placement moves its team's and the org's rows."""
    demand: dict[tuple[str, str], list[int]] = {}
    for row in ds.tasks:
        tenant_id, rc, spec = row[2], row[5], orjson.loads(row[6])
        members = int((spec.get("gang") or {}).get("members", 1))
        acc = demand.setdefault((tenant_id, rc), [0, 0])
        acc[0] += int(spec["requests"].get("cpuMillis", 0)) * members
        acc[1] += int(spec["requests"].get("memoryMiB", 0)) * members
    quotas: dict[str, dict[str, dict[str, Quota]]] = {}
    for (tenant_id, rc), (cpu, memory) in demand.items():
        quotas.setdefault(tenant_id, {})[rc] = {
            "cpuMillis": Quota(cpu), "memoryMiB": Quota(memory)}
    conn = await bench_connect(url)
    try:
        async with conn.transaction():
            now = datetime.now(UTC)
            await cohort_put(conn, cohort_id="org", parent=None, fair_weight=1.0, quotas={},
                             now=now)
            for team in range(QUOTA_TEAMS):
                await cohort_put(conn, cohort_id=f"team-{team}", parent="org",
                                 fair_weight=1.0, quotas={}, now=now)
            for i, tenant_id in enumerate(sorted(quotas)):
                await tenant_put(conn, tenant_id=tenant_id, cohort=f"team-{i % QUOTA_TEAMS}",
                                 fair_weight=1.0, quotas=quotas[tenant_id], now=now)
    finally:
        await conn.close()


async def _place_with_reconcilers(url: str, ds: Dataset, cfg: E2EConfig,
                                  logdir: Path, progress: Progress) -> dict[str, Any]:
    progress.phase(f"loading {len(ds.pools):,} pools and {len(ds.tasks):,} tasks")
    await dataset_load(url, ds, now=datetime.now(UTC))
    if cfg.quotas:
        await _quotas_set(url, ds)
    history_seconds = await history_load(url, ds, finished=cfg.finished, now=datetime.now(UTC))
    conn = await bench_connect(url)
    procs = _start_reconcilers(url, cfg, logdir)
    spy = None
    tail = None
    profiling = None
    statements: dict[str, Any] = {}
    wal_kinds: dict[str, Any] = {}
    finished = False
    try:
        progress.phase(f"starting {cfg.reconcilers} reconcilers")
        await _wait_ready(conn, procs, logdir, cfg.ready_timeout_seconds)
        await asyncio.sleep(0.5)  # let the start-up passes over an empty queue finish
        await runtimes_heartbeat(conn)
        if cfg.py_spy:
            spy = _spy_start(procs[0].pid, cfg.py_spy)
            await asyncio.sleep(1.0)
        tail = _LogTail([logdir / f"reconciler-{i}.log" for i in range(cfg.reconcilers)])
        tail.poll()
        started = time.monotonic()
        database = database_name(url)
        own = frozenset({conn.get_server_pid()})
        cpu_before = _cpu_sample(procs, database, own)
        profiling = await profile_start(conn, list(WRITTEN)) if cfg.profile_out else None
        wal_before = await conn.fetchval("SELECT pg_current_wal_lsn()")
        progress.phase("placing", total=len(ds.tasks), unit="leased")
        admission = await dataset_admit(url)
        peak_rss = _rss(procs)
        last_beat = last_count = time.monotonic()
        leased, progress_at, progressed = 0, started, 0
        total = len(ds.tasks)
        while True:
            peak_rss = max(peak_rss, _rss(procs))
            now = time.monotonic()
            # The pass log lines say when the work should be done; the database confirms
            # (and is asked once a second anyway, in case a log line was missed).
            progress.update(max(leased, tail.poll()))
            if tail.leased >= total or now - last_count >= COUNT_EVERY_SECONDS:
                leased = await conn.fetchval("SELECT count(*) FROM tasks WHERE state = 'LEASED'")
                last_count = now
                if leased >= total:
                    break
            if leased > progressed:
                progressed, progress_at = leased, now
            elif now - progress_at > cfg.stall_seconds:
                stuck = await conn.fetch(
                    """SELECT state, pending_reason ->> 'code' AS code, count(*) AS n FROM tasks
                       WHERE state = 'ADMITTED' GROUP BY 1, 2
                       ORDER BY n DESC LIMIT 5"""
                )
                raise BenchFailed(
                    f"no progress for {cfg.stall_seconds:.0f} s at {leased}/{total} leased; "
                    f"remaining: {[dict(r) for r in stuck]}; logs in {logdir}"
                )
            _died(procs, logdir)
            if now - last_beat >= HEARTBEAT_EVERY_SECONDS:
                await runtimes_heartbeat(conn)
                last_beat = now
            await asyncio.sleep(POLL_SECONDS)
        # The clock stops when the last lease committed, as each baseline's stops at its
        # workers' last commit, not when this loop noticed it (up to a poll interval and a
        # count later).
        noticed, noticed_at = time.monotonic(), time.time()
        ended = tail.stopped(noticed, noticed_at, total)
        wall = ended - admission.committed
        progress.end(leased, rate=leased / wall if wall > 0 else None)
        peak_rss = max(peak_rss, _rss(procs))
        cpu = _cpu_used(cpu_before, _cpu_sample(procs, database, own))
        wal = await conn.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", wal_before
        )
        if profiling is not None:
            statements = await profile_statements(conn, profiling, len(ds.tasks))
            wal_kinds = await profile_wal(conn, profiling, len(ds.tasks))
        finished = True
    finally:
        if not finished:
            conn.terminate()
        if tail is not None:
            tail.close()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
        _stop(procs)
    try:
        latency = await _latency(conn)
        invariants = await ledger_check(conn)
        writes = await _row_writes(conn, ds) if not cfg.finished else None
        records = await _records_size(conn)
        profile = None
        if profiling is not None:
            profile = await profile_collect(conn, profiling, list(WRITTEN), len(ds.tasks))
            profile["statements"] = statements
            profile["wal"] = wal_kinds
    finally:
        await conn.close()
    return {
        "profile": profile,
        "writes": writes,
        "wall": wall,
        "wallWithAdmission": ended - started,
        "stopLag": noticed - ended,
        "admit": admission.seconds,
        "history": history_seconds,
        "rss": peak_rss,
        "cpu": cpu,
        "wal": float(wal),
        "latency": latency,
        "invariants": invariants,
        "logs": _log_totals(logdir, cfg.reconcilers),
        "records": records,
    }


async def _records_size(conn: asyncpg.Connection) -> tuple[int, int]:
    """Return how many passes were recorded and the bytes their records store (inputs,
    decisions and the static pools they name)."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(sum(octet_length(inputs) + octet_length(decisions)), 0)"
        " AS b FROM pass_records")
    pools = await conn.fetchval(
        "SELECT coalesce(sum(octet_length(pools)), 0) FROM pass_record_pools")
    return int(row["n"]), int(row["b"]) + int(pools)


#: Berth's tables a placement writes to; the floor writes to a subset of them.
WRITTEN = ("tasks", "task_events", "ledgers", "reservations", "leases")


async def _row_writes(conn: asyncpg.Connection, ds: Dataset) -> dict[str, float]:
    """Return the rows inserted, updated or deleted per placement in each of :data:`WRITTEN`
    (``pg_stat_user_tables``), less what loading and admitting the dataset wrote.

    Call it once every other connection to the database has closed: a backend reports its
    counts as it exits, before it leaves ``pg_stat_activity``.
    """
    for _ in range(200):
        others = await conn.fetchval(
            """SELECT count(*) FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()""")
        if not others:
            break
        await asyncio.sleep(0.05)
    rows = await conn.fetch(
        """SELECT relname, n_tup_ins + n_tup_upd + n_tup_del AS n FROM pg_stat_user_tables
           WHERE relname = ANY($1::text[])""", list(WRITTEN))
    loaded = {"tasks": len(ds.tasks), "task_events": len(ds.tasks), "ledgers": len(ds.pools)}
    counts = {r["relname"]: r["n"] - loaded.get(r["relname"], 0) for r in rows}
    return {t: round(counts.get(t, 0) / len(ds.tasks), 2) for t in WRITTEN}


async def _place_naive(url: str, ds: Dataset, cfg: E2EConfig) -> dict[str, Any]:
    await dataset_load(url, ds, now=datetime.now(UTC))
    await dataset_admit(url)
    limit = None if len(ds.tasks) <= cfg.naive_tasks else cfg.naive_tasks
    conn = await bench_connect(url)
    try:
        work = asyncio.ensure_future(asyncio.to_thread(
            naive_run, url, database_name(url), workers=cfg.reconcilers, limit=limit))
        # Runtimes keep heartbeating, as during the reconcilers' run.
        while not work.done():
            await runtimes_heartbeat(conn)
            await asyncio.wait({work}, timeout=HEARTBEAT_EVERY_SECONDS)
        result = work.result()
        invariants = await ledger_check(conn)
        leased = await conn.fetchval("SELECT count(*) FROM tasks WHERE state = 'LEASED'")
    finally:
        await conn.close()
    return {"result": result, "invariants": invariants, "leased": leased, "limited": limit}


async def _place_floor(url: str, ds: Dataset, cfg: E2EConfig) -> dict[str, Any]:
    await dataset_load(url, ds, now=datetime.now(UTC))
    await floor_prepare(url, ds)
    await dataset_admit(url)
    result = await asyncio.to_thread(
        floor_run, url, database_name(url), clients=cfg.floor_clients, batch=cfg.floor_batch,
        lease_ttl_seconds=LEASE_TTL_SECONDS)
    conn = await bench_connect(url)
    try:
        invariants = await ledger_check(conn)
        leased = await conn.fetchval("SELECT count(*) FROM tasks WHERE state = 'LEASED'")
        writes = await _row_writes(conn, ds)
    finally:
        await conn.close()
    return {"result": result, "invariants": invariants, "leased": leased, "writes": writes}


async def _place_minimal_floor(url: str, ds: Dataset, cfg: E2EConfig) -> dict[str, Any]:
    await minimal_floor_prepare(url, ds)
    result = await asyncio.to_thread(
        minimal_floor_run, url, database_name(url), clients=cfg.floor_clients,
        batch=cfg.floor_batch, lease_ttl_seconds=LEASE_TTL_SECONDS)
    return {"result": result, **await minimal_floor_check(url)}


async def _server_facts(server_url: str) -> dict[str, Any]:
    conn = await bench_connect(server_url)
    try:
        return {
            "synchronousCommit": await conn.fetchval("SHOW synchronous_commit"),
            "postgres": (await conn.fetchval("SHOW server_version")).split()[0],
        }
    finally:
        await conn.close()


def _logdir(path: str) -> Path:
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _per_placement(cpu_seconds: float, placed: int) -> float | None:
    return round(1000 * cpu_seconds / placed, 3) if placed and cpu_seconds > 0 else None


async def e2e_run(cfg: E2EConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark described by ``cfg`` on ``cfg.server_url`` and return its one-line
    JSON result; show its phases on ``progress``."""
    progress = progress or Progress("berth bench e2e")
    progress.phase("generating the dataset")
    ds = dataset_generate(pools=cfg.pools, tasks=cfg.tasks, seed=cfg.seed, mix=cfg.mix)
    facts = await _server_facts(cfg.server_url)
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as tmp:
        logdir = _logdir(cfg.keep_logs or tmp)
        async with scratch_database(cfg.server_url, settings=dict(cfg.pg_settings)) as url:
            run = await _place_with_reconcilers(url, ds, cfg, logdir, progress)
            if cfg.records_out:
                from bench.plan import records_save

                await records_save(url, Path(cfg.records_out))
            if cfg.replay:
                progress.phase("replaying the recorded passes")
                run["replay"] = await asyncio.to_thread(_replay, url, cfg)
                progress.end()
    naive: dict[str, Any] | None = None
    if not cfg.skip_naive:
        progress.phase("naive baseline", total=min(cfg.tasks, cfg.naive_tasks), unit="placed")
        async with scratch_database(cfg.server_url) as url:
            naive = await _place_naive(url, ds, cfg)
        progress.end(naive["result"].placed, rate=naive["result"].rate)
    floor: dict[str, Any] | None = None
    if not cfg.skip_floor:
        progress.phase("SQL floor", total=cfg.tasks, unit="placed")
        async with scratch_database(cfg.server_url) as url:
            floor = await _place_floor(url, ds, cfg)
        progress.end(floor["result"].placed, rate=floor["result"].rate)
    minimal: dict[str, Any] | None = None
    if not cfg.skip_minimal_floor:
        progress.phase("minimal SQL floor", total=cfg.tasks, unit="placed")
        async with scratch_database(cfg.server_url, prefix="berth_bench_minimal",
                                    migrate=False) as url:
            minimal = await _place_minimal_floor(url, ds, cfg)
        progress.end(minimal["result"].placed, rate=minimal["result"].rate)
    peer = None
    if not cfg.skip_peer and peer_available():
        progress.phase("peer queue (pgqueuer)", total=cfg.tasks, unit="jobs")
        async with scratch_database(cfg.server_url, prefix="berth_bench_peer",
                                    migrate=False) as url:
            await peer_prepare(url, ds)
            peer = await asyncio.to_thread(peer_run, url, database_name(url),
                                           clients=cfg.peer_clients, batch=PEER_BATCH)
        progress.end(peer.jobs, rate=peer.rate)
    progress.end()
    rate = cfg.tasks / run["wall"] if run["wall"] > 0 else 0.0
    lat = run["latency"]
    cpu_work = run["cpu"]["reconcilers"] + run["cpu"]["postgres"]
    out: dict[str, Any] = {
        "pools": cfg.pools,
        "tasks": cfg.tasks,
        "reconcilers": cfg.reconcilers,
        # What the reconcilers used: --batch, else their own BERTH_BATCH_SIZE/default.
        "batch": cfg.batch or Settings().batch_size,
        "tenants": ds.tenants,
        "quotas": bool(cfg.quotas),
        "leased": lat["leased"],
        "placementsPerSec": round(rate, 1),
        "wallSeconds": round(run["wall"], 3),
        # How much later than the last lease's commit the bench noticed it (not on the clock).
        "clockStopLagMs": round(run["stopLag"] * 1000, 1),
        # The rate with the admission transaction inside the clock (no baseline counts the
        # admission of its tasks or the enqueueing of its jobs).
        "placementsPerSecWithAdmission": round(
            cfg.tasks / run["wallWithAdmission"], 1) if run["wallWithAdmission"] > 0 else 0.0,
        "admitSeconds": round(run["admit"], 3),
        "p50LeaseMs": round(lat["p50"] or 0.0, 1),
        "p99LeaseMs": round(lat["p99"] or 0.0, 1),
        "maxLeaseMs": round(lat["max"] or 0.0, 1),
        "passes": run["logs"]["passes"],
        "conflicts": run["logs"]["conflicts"],
        "reconcilerErrors": run["logs"]["errors"],
        "passPhasesMs": run["logs"]["phases"],
        # The reconcilers' CPU per placement by phase of the pass (bench.profile).
        "passCpuUsPerPlacement": phases_per_placement(
            run["logs"]["cpu"], run["cpu"]["reconcilers"], cfg.tasks),
        "peakRssMiB": round(run["rss"] / 2**20, 1),
        "cpuSeconds": run["cpu"],
        # WAL is server-wide: other databases' writes during the run count too.
        "walMiB": round(run["wal"] / 2**20, 1),
        "walKiBPerPlacement": round(run["wal"] / 1024 / cfg.tasks, 2),
        # CPU that placing cost (reconcilers + PostgreSQL) per placement, and the rate this
        # machine's cores would sustain if that were the only limit: robust to other load.
        "cpuMsPerPlacement": _per_placement(cpu_work, cfg.tasks),
        "cpuBoundPlacementsPerSec": round((os.cpu_count() or 1) * cfg.tasks / cpu_work, 1)
        if cpu_work > 0 else None,
        # Recorded passes (BERTH_PASS_RECORDS_SECONDS; 0 records none) and what they store.
        "passRecords": run["records"][0],
        "passRecordBytesPerPlacement": round(run["records"][1] / cfg.tasks, 1),
        **({"replay": run["replay"]} if "replay" in run else {}),
        "rowWritesPerPlacement": run["writes"],
        "invariantsOk": not any(run["invariants"].values()),
        "invariants": run["invariants"],
        "naivePlacementsPerSec": None,
        "naiveTasks": None,
        "naiveParked": None,
        "naiveLeased": None,
        "naiveInvariantsOk": None,
        "naiveCpuMsPerPlacement": None,
        "ratioVsNaive": None,
        "floorPlacementsPerSec": None,
        "floorCpuMsPerPlacement": None,
        "floorClients": None,
        "floorBatch": None,
        "floorLeased": None,
        "floorUnplaced": None,
        "floorInvariantsOk": None,
        "floorRowWritesPerPlacement": None,
        "fractionOfFloor": None,
        "minimalFloorPlacementsPerSec": None,
        "minimalFloorCpuMsPerPlacement": None,
        "minimalFloorClients": None,
        "minimalFloorBatch": None,
        "minimalFloorLeased": None,
        "minimalFloorUnplaced": None,
        "minimalFloorInvariantsOk": None,
        "minimalFloorInvariants": None,
        "fractionOfMinimalFloor": None,
        "peer": None,
        "peerJobsPerSec": None,
        "peerCpuMsPerJob": None,
        "ratioVsPeer": None,
        "mix": cfg.mix,
        "specMix": ds.kinds,
        "finished": cfg.finished,
        "finishedLoadSeconds": round(run["history"], 1),
        "seed": cfg.seed,
        "cpus": os.cpu_count(),
        "loadAverage1m": round(os.getloadavg()[0], 2),
        # The reconcilers run this tree with this environment (BERTH_COMPILED included).
        "schedulerCompiled": compiled_active(),
        **facts,
        **({"profile": run["profile"]} if run["profile"] is not None else {}),
    }
    if naive is not None:
        n = naive["result"]
        out["naivePlacementsPerSec"] = round(n.rate, 1)
        out["naiveTasks"] = n.placed
        out["naiveParked"] = n.parked
        out["naiveLeased"] = naive["leased"]
        out["naiveInvariantsOk"] = not any(naive["invariants"].values())
        out["naiveCpuMsPerPlacement"] = _per_placement(n.cpu_seconds, n.placed)
        out["ratioVsNaive"] = round(rate / n.rate, 2) if n.rate > 0 else None
    if floor is not None:
        out.update(_floor_fields("floor", "fractionOfFloor", floor, rate))
        out["floorRowWritesPerPlacement"] = floor["writes"]
    if minimal is not None:
        out.update(_floor_fields("minimalFloor", "fractionOfMinimalFloor", minimal, rate))
        out["minimalFloorInvariants"] = minimal["invariants"]
    if peer is not None:
        out["peer"] = f"pgqueuer {peer.version}, {peer.clients} consumers, batch {peer.batch}"
        out["peerJobsPerSec"] = round(peer.rate, 1)
        out["peerCpuMsPerJob"] = _per_placement(peer.cpu_seconds, peer.jobs)
        out["ratioVsPeer"] = round(rate / peer.rate, 2) if peer.rate > 0 else None
    return out


def _floor_fields(prefix: str, fraction: str, run: dict[str, Any], rate: float) -> dict[str, Any]:
    """Return a floor's fields, named from ``prefix``, and Berth's rate over its as
    ``fraction``."""
    f = run["result"]
    return {
        f"{prefix}PlacementsPerSec": round(f.rate, 1),
        f"{prefix}CpuMsPerPlacement": _per_placement(f.cpu_seconds, f.placed),
        f"{prefix}Clients": f.clients,
        f"{prefix}Batch": f.batch,
        f"{prefix}Leased": run["leased"],
        f"{prefix}Unplaced": f.unplaced,
        f"{prefix}InvariantsOk": not any(run["invariants"].values()),
        fraction: round(rate / f.rate, 3) if f.rate > 0 else None,
    }


def _sweep_axes(items: list[str]) -> dict[str, list[int]]:
    axes: dict[str, list[int]] = {}
    for item in items:
        key, _, values = item.partition("=")
        if key not in ("pools", "reconcilers", "tasks", "quotas") or not values:
            raise SystemExit(f"berth bench e2e: --sweep takes KEY=V1,V2,... with KEY one of "
                             f"pools, reconcilers, tasks, quotas; not {item!r}")
        try:
            axes[key] = [int(v) for v in values.split(",")]
        except ValueError:
            raise SystemExit(f"berth bench e2e: --sweep {item!r}: values must be integers"
                             ) from None
    return axes


def _pg_settings(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"berth bench e2e: --pg-setting takes NAME=VALUE, not {item!r}")
        out.append((name, value))
    return tuple(out)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``berth bench e2e``."""
    p = argparse.ArgumentParser(
        prog="berth bench e2e",
        description="Run reconcilers against a fresh database until every task is leased, "
        "then, on the same server and dataset, the naive baseline, the SQL floor on Berth's "
        "schema, the minimal SQL floor on its own tables and the peer queue; print one JSON "
        "line. Without --server-url or BERTH_DATABASE_URL, an embedded "
        "PostgreSQL is started in a temporary directory for the run.",
    )
    p.add_argument("--pools", type=int, default=1000, help="pools (default 1000)")
    p.add_argument("--tasks", type=int, default=20000, help="admitted tasks (default 20000)")
    p.add_argument("--reconcilers", type=int, default=2, help="reconciler processes (default 2)")
    p.add_argument("--batch", type=int, help="BERTH_BATCH_SIZE of the reconcilers "
                   "(default: theirs)")
    p.add_argument("--server-url", default=env_server_url(), help=SERVER_HELP)
    p.add_argument("--seed", type=int, default=1, help="dataset seed (default 1)")
    p.add_argument("--skip-naive", action="store_true", help="do not run the naive baseline")
    p.add_argument("--naive-tasks", type=int, default=5000,
                   help="tasks the naive baseline places (default min(T, 5000))")
    p.add_argument("--skip-floor", action="store_true",
                   help="do not run the SQL floor on Berth's schema")
    p.add_argument("--skip-minimal-floor", action="store_true",
                   help="do not run the minimal SQL floor (on its own tables)")
    p.add_argument("--floor-clients", type=int, default=4,
                   help="connections of each SQL floor (default 4)")
    p.add_argument("--floor-batch", type=int, default=FLOOR_BATCH,
                   help=f"tasks each SQL floor claims per transaction (default {FLOOR_BATCH})")
    p.add_argument("--skip-peer", action="store_true",
                   help="do not run the peer queue (pgqueuer; skipped when not installed)")
    p.add_argument("--peer-clients", type=int, default=4,
                   help="consumer processes of the peer queue (default 4)")
    p.add_argument("--mix", choices=MIXES, default="default",
                   help="spec mix: default, antiaffinity (10%% required anti-affinity) or "
                        "gangs (10%% gangs of 2-4)")
    p.add_argument("--finished", type=int, default=0, metavar="N",
                   help="preload N finished tasks (events, ended leases) into the "
                        "reconcilers' database before the run (default 0)")
    p.add_argument("--stall-seconds", type=float, default=60.0,
                   help="give up after this long without a new lease (default 60)")
    p.add_argument("--py-spy", metavar="PATH",
                   help="record reconciler 0 with py-spy (raw format) into PATH")
    p.add_argument("--logs", metavar="DIR", help="keep the reconcilers' logs in DIR")
    p.add_argument("--pg-setting", action="append", default=[], metavar="NAME=VALUE",
                   help="ALTER DATABASE SET for the reconcilers' database (repeatable), "
                        "e.g. log_min_duration_statement=0 to profile the server side")
    p.add_argument("--quotas", action="store_true",
                   help="give every tenant a quota (nominal = its whole demand) in a tree "
                        "org -> 4 teams -> tenants "
                        "before admitting; compare with --sweep quotas=0,1")
    p.add_argument("--replay", action="store_true",
                   help="after the run, replay its recorded passes (berth replay --since 10m) "
                   "and report whether every decision is identical")
    p.add_argument("--profile-out", metavar="DIR",
                   help="write where the run's CPU goes into DIR (profile.md, profile.json): "
                   "the reconcilers' CPU by phase of the pass, PostgreSQL's time per "
                   "statement (pg_stat_statements, preloaded by the embedded PostgreSQL), "
                   "index entries per placement")
    p.add_argument("--records-out", metavar="FILE",
                   help="write the run's recorded passes to FILE, for berth bench plan")
    p.add_argument("--sweep", nargs="+", metavar="KEY=V1,V2",
                   help="run every combination, e.g. pools=1000,5000 reconcilers=1,2,4 "
                        "quotas=0,1 (baselines skipped but the minimal SQL floor)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs (default 1); with --sweep, per point (the chart shows the best); "
                        "without, the whole side by side N times, then each headline "
                        "figure's median and range over the runs")
    p.add_argument("--chart", metavar="PATH", help="with --sweep: write a PNG chart to PATH")
    json_option(p)
    return p


def _sound(result: dict[str, Any]) -> bool:
    return (result["invariantsOk"] and result["leased"] == result["tasks"]
            and result["floorInvariantsOk"] is not False
            and result["minimalFloorInvariantsOk"] is not False
            and result["naiveInvariantsOk"] is not False)


def _headline(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Return the figures a person reads first, as (name, value) rows."""
    rows = [
        ("placements per second", f"{r['placementsPerSec']:,.1f}"),
        ("lease latency p50 / p99", f"{r['p50LeaseMs']:,.1f} ms / {r['p99LeaseMs']:,.1f} ms"),
        ("CPU per placement", f"{r['cpuMsPerPlacement']} ms (reconcilers and PostgreSQL)"),
        ("tasks leased", f"{r['leased']:,} of {r['tasks']:,}; ledger invariants "
                         + ("hold" if r["invariantsOk"] else "BROKEN")),
        ("peak reconciler memory", f"{r['peakRssMiB']:,.1f} MiB"),
    ]
    if r["naivePlacementsPerSec"] is not None:
        rows.append(("naive scheduler", f"{r['naivePlacementsPerSec']:,.1f} placements/s "
                                        f"(Berth: {r['ratioVsNaive']}x)"))
    if r["floorPlacementsPerSec"] is not None:
        rows.append(("SQL floor", f"{r['floorPlacementsPerSec']:,.1f} placements/s "
                                  f"(Berth: {100 * (r['fractionOfFloor'] or 0):.0f} % of it)"))
    if r["minimalFloorPlacementsPerSec"] is not None:
        rows.append(("minimal SQL floor",
                     f"{r['minimalFloorPlacementsPerSec']:,.1f} placements/s "
                     f"(Berth: {100 * (r['fractionOfMinimalFloor'] or 0):.0f} % of it)"))
    if r["peerJobsPerSec"] is not None:
        rows.append(("peer queue", f"{r['peerJobsPerSec']:,.1f} jobs/s ({r['peer']}; "
                                   f"Berth: {r['ratioVsPeer']}x)"))
    return rows


def _title(r: dict[str, Any]) -> str:
    return (f"berth bench e2e: {r['pools']:,} pools, {r['tasks']:,} tasks, {r['reconcilers']} "
            f"reconcilers; PostgreSQL {r['postgres']}, {r['cpus']} CPUs, "
            f"load {r['loadAverage1m']}"
            f"{'' if r.get('schedulerCompiled', True) else '; scheduler not compiled'}")


def _run_printed(cfg: E2EConfig, progress: Progress, *, as_json: bool, table: bool = True,
                 label: str = "") -> dict[str, Any] | None:
    """Run once and print its JSON line (or, with ``table``, its headline table); on failure
    say why on stderr and return None."""
    try:
        result = asyncio.run(e2e_run(cfg, progress))
    except BenchFailed as exc:
        progress.end()
        print(f"berth bench e2e: {label}{exc}", file=sys.stderr)
        return None
    if cfg.profile_out:
        profile_write(cfg.profile_out, result)
    if as_json or table:
        result_print(result, as_json=as_json, title=_title(result), rows=_headline,
                     dumps=lambda r: orjson.dumps(r).decode())
    return result


def _sweep_row(r: dict[str, Any]) -> tuple[str, str]:
    """Return one sweep run's point and figures as a (name, value) row."""
    point = f"{r['pools']} pools, {r['tasks']} tasks, {r['reconcilers']} rec., " + (
        "quotas" if r["quotas"] else "no quotas")
    figures = (f"{r['placementsPerSec']:>10,.1f}/s  p99 {r['p99LeaseMs']:,.1f} ms  "
               f"{r['cpuMsPerPlacement']} CPU ms/placement")
    if r["fractionOfMinimalFloor"] is not None:
        figures += f"  {100 * r['fractionOfMinimalFloor']:.0f} % of minimal floor"
    return point, figures


#: The figures ``--repeat`` summarizes over its runs (median, lowest, highest).
REPEATED = (
    "placementsPerSec", "cpuMsPerPlacement", "p50LeaseMs", "p99LeaseMs", "ratioVsNaive",
    "fractionOfFloor", "fractionOfMinimalFloor", "ratioVsPeer", "walKiBPerPlacement",
)


def repeat_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the median, lowest and highest value of each figure of :data:`REPEATED` over
    ``runs`` (the runs that have it: a skipped baseline has none)."""
    out: dict[str, Any] = {"summary": "repeat", "runs": len(runs)}
    for key in REPEATED:
        values = sorted(r[key] for r in runs if r.get(key) is not None)
        # The median of an even count is a mean: rounded, it prints as its inputs do.
        out[key] = (None if not values else {"median": round(statistics.median(values), 6),
                                             "min": values[0], "max": values[-1]})
    return out


def _runs(
    cfg: E2EConfig, args: argparse.Namespace, progress: Progress, *,
    context: Callable[[int], str], label: Callable[[int], str],
) -> list[dict[str, Any]] | None:
    """Run ``cfg`` ``--repeat`` times, each run printed as it ends (``context(n)`` before its
    phases, ``label(n)`` before its failure); None once one fails."""
    runs = []
    for n in range(1, args.repeat + 1):
        progress.context = context(n)
        result = _run_printed(cfg, progress, as_json=args.json, table=False, label=label(n))
        if result is None:
            return None
        runs.append(result)
    return runs


def _repeat(base: E2EConfig, args: argparse.Namespace, progress: Progress) -> int:
    """Run the side by side ``--repeat`` times, each run printed as it ends, then the
    summary: one more JSON line with ``--json``, else a table."""
    runs = _runs(base, args, progress, context=lambda n: f"[run {n}/{args.repeat}] ",
                 label=lambda n: f"run {n}: ")
    if runs is None:
        return 1
    summary = repeat_summary(runs)
    if args.json:
        print(orjson.dumps(summary).decode(), flush=True)
    else:
        table_print(f"{_title(runs[-1])}; {len(runs)} runs: median (lowest-highest)",
                    [(key, f"{v['median']:,} ({v['min']:,}-{v['max']:,})")
                     for key, v in summary.items() if isinstance(v, dict)])
    return 0 if all(_sound(r) for r in runs) else 1


def _sweep(base: E2EConfig, args: argparse.Namespace, progress: Progress) -> int:
    axes = _sweep_axes(args.sweep)
    keys = list(axes)
    best: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    points = list(itertools.product(*(axes[k] for k in keys)))
    for index, combo in enumerate(points, 1):
        point = dict(zip(keys, combo, strict=True))
        cfg = replace(base, **point, skip_naive=True, skip_floor=True, skip_peer=True,
                      py_spy=None)
        runs = _runs(cfg, args, progress,
                     context=lambda _, i=index, p=point: f"[{i}/{len(points)} {p}] ",
                     label=lambda _, p=point: f"{p}: ")
        if runs is None:
            return 1
        every.extend(runs)
        # The machine may be shared: the best run is the one least disturbed by other work.
        best.append(max(runs, key=lambda r: r["placementsPerSec"]))
    if not args.json:
        table_print("berth bench e2e --sweep: every run", [_sweep_row(r) for r in every])
    if args.chart:
        from bench.chart import chart_write

        chart_write(best, Path(args.chart))
    return 0 if all(_sound(r) for r in every) else 1


def main(argv: list[str]) -> int:
    """Run ``berth bench e2e`` with ``argv`` and print one JSON line per run."""
    args = build_parser().parse_args(argv)
    for name in ("pools", "tasks", "reconcilers", "floor_clients", "floor_batch",
                 "peer_clients"):
        if getattr(args, name) < 1:
            flag = name.replace("_", "-")
            raise SystemExit(f"berth bench e2e: --{flag} must be at least 1")
    if args.finished < 0:
        raise SystemExit("berth bench e2e: --finished must be at least 0")
    if args.repeat < 1:
        raise SystemExit("berth bench e2e: --repeat must be at least 1")
    if args.repeat > 1 and not args.sweep and (args.profile_out or args.records_out):
        raise SystemExit("berth bench e2e: --profile-out and --records-out write one run, "
                         "not a --repeat")
    if args.chart and not args.sweep:
        raise SystemExit("berth bench e2e: --chart needs --sweep")
    if args.profile_out and args.sweep:
        raise SystemExit("berth bench e2e: --profile-out profiles one run, not a --sweep")
    options = (PRELOAD,) if args.profile_out else ()
    with postgres_server(args.server_url, options=options) as (server_url, _described):
        base = E2EConfig(
            pools=args.pools, tasks=args.tasks, reconcilers=args.reconcilers, batch=args.batch,
            server_url=server_url, seed=args.seed, skip_naive=args.skip_naive,
            naive_tasks=args.naive_tasks, stall_seconds=args.stall_seconds,
            py_spy=args.py_spy, keep_logs=args.logs, pg_settings=_pg_settings(args.pg_setting),
            skip_floor=args.skip_floor, floor_clients=args.floor_clients,
            floor_batch=args.floor_batch, skip_minimal_floor=args.skip_minimal_floor,
            skip_peer=args.skip_peer,
            peer_clients=args.peer_clients, mix=args.mix, finished=args.finished,
            quotas=int(args.quotas), replay=args.replay, profile_out=args.profile_out,
            records_out=args.records_out,
        )
        with Progress("berth bench e2e") as progress:
            if args.sweep:
                return _sweep(base, args, progress)
            if args.repeat > 1:
                return _repeat(base, args, progress)
            result = _run_printed(base, progress, as_json=args.json)
        return 1 if result is None else (0 if _sound(result) else 1)
