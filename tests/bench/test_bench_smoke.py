"""The e2e benchmark end to end on a tiny dataset: every task leased, the ledger sound, the
floors doing less than Berth."""

from __future__ import annotations

import orjson
import pytest

from app.scheduling.spec import TaskSpec
from bench import e2e
from bench.chart import chart_write
from bench.dataset import dataset_generate

FIELDS = (
    "pools", "tasks", "reconcilers", "placementsPerSec", "p50LeaseMs", "p99LeaseMs", "passes",
    "conflicts", "naivePlacementsPerSec", "naiveTasks", "ratioVsNaive", "peakRssMiB",
    "cpuMsPerPlacement", "naiveCpuMsPerPlacement", "floorPlacementsPerSec", "fractionOfFloor",
    "minimalFloorPlacementsPerSec", "minimalFloorCpuMsPerPlacement", "fractionOfMinimalFloor",
    "minimalFloorInvariantsOk",
)


def _tiny(server_url: str, tasks: int, reconcilers: int, *flags: str) -> int:
    """Run ``berth bench e2e`` on 20 pools and ``tasks`` tasks with ``flags``; return its
    exit status."""
    return e2e.main(["--pools", "20", "--tasks", str(tasks), "--reconcilers", str(reconcilers),
                     "--server-url", server_url, "--stall-seconds", "30", *flags])


def test_dataset_is_deterministic_valid_and_fits() -> None:
    first = dataset_generate(pools=20, tasks=300, seed=7)
    again = dataset_generate(pools=20, tasks=300, seed=7)
    assert first.tasks == again.tasks and first.ledgers == again.ledgers
    assert len(first.pools) == 20 and len(first.tasks) == 300
    assert sum(first.kinds.values()) == 300 and first.kinds["simple"] > 150
    assert len(first.anchors) == 300 and set(first.anchors) <= {p[0] for p in first.pools}
    demand = [0, 0, 0]
    for row in first.tasks:
        spec = TaskSpec.model_validate(orjson.loads(row[6]))
        members = spec.gang.members if spec.gang else 1
        for d, amount in enumerate(spec.requests.as_tuple()):
            demand[d] += members * amount
    totals = [sum(ledger[1 + d] for ledger in first.ledgers) for d in range(3)]
    assert all(total >= 2 * need for total, need in zip(totals, demand, strict=True))
    # Each anchor pool has room for every task anchored on it (the floor places them there).
    anchored: dict[str, list[int]] = {}
    for row, pool_id in zip(first.tasks, first.anchors, strict=True):
        spec = orjson.loads(row[6])
        members = (spec.get("gang") or {}).get("members", 1)
        acc = anchored.setdefault(pool_id, [0, 0, 0])
        for d, key in enumerate(("cpuMillis", "memoryMiB", "llmSlots")):
            acc[d] += members * spec["requests"][key]
    capacity = {ledger[0]: ledger[1:] for ledger in first.ledgers}
    for pool_id, need in anchored.items():
        assert all(n <= c for n, c in zip(need, capacity[pool_id], strict=True)), pool_id


def test_dataset_refuses_fewer_pools_than_runtime_classes() -> None:
    with pytest.raises(ValueError, match="at least"):
        dataset_generate(pools=2, tasks=10)


def test_sweep_axes_are_parsed_and_bad_ones_refused() -> None:
    assert e2e._sweep_axes(["pools=1000,5000", "reconcilers=1,2"]) == {
        "pools": [1000, 5000], "reconcilers": [1, 2]
    }
    with pytest.raises(SystemExit, match="KEY=V1"):
        e2e._sweep_axes(["nodes=3"])
    with pytest.raises(SystemExit, match="integers"):
        e2e._sweep_axes(["pools=many"])


def test_pass_log_lines_are_summed(tmp_path) -> None:
    lines = [
        {"level": "info", "msg": "reconciler started", "slots_owned": 32},
        {"level": "info", "msg": "pass", "claimed": 5, "leased": 4, "conflicts": 1,
         "claim_ms": 1.5, "snapshot_ms": 2.0, "select_ms": 3.0, "commit_ms": 4.0,
         "duration_ms": 10.5, "cpu_plan_ms": 2.5, "cpu_commit_build_ms": 0.25},
        {"level": "error", "msg": "reconcile pass failed; its claims will expire"},
    ]
    (tmp_path / "reconciler-0.log").write_bytes(
        b"\n".join(orjson.dumps(x) for x in lines) + b"\nnot json\n"
    )
    (tmp_path / "reconciler-1.log").write_bytes(orjson.dumps(lines[1]) + b"\n")
    totals = e2e._log_totals(tmp_path, 2)
    assert (totals["passes"], totals["leased"], totals["conflicts"], totals["errors"]) == (
        2, 8, 2, 1
    )
    assert totals["phases"]["commit"] == 8.0
    assert totals["cpu"]["plan"] == 5.0 and totals["cpu"]["commit_build"] == 0.5
    assert totals["cpu"]["record"] == 0.0
    tail = e2e._LogTail([tmp_path / "reconciler-0.log", tmp_path / "reconciler-1.log"])
    try:
        assert tail.poll() == 8
        with open(tmp_path / "reconciler-1.log", "ab") as f:
            f.write(orjson.dumps({**lines[1], "leased": 3}) + b"\n")
        assert tail.poll() == 11
    finally:
        tail.close()


def test_the_clock_stops_at_the_last_leasing_pass(tmp_path) -> None:
    """Berth's clock stops when its last lease committed (the log time of the last pass that
    leased, rounded up to its millisecond), not when the bench noticed it."""
    pass_line = {"level": "info", "msg": "pass", "claimed": 5}
    (tmp_path / "reconciler-0.log").write_bytes(b"\n".join([
        orjson.dumps({**pass_line, "ts": "2026-01-01T00:00:10.250+00:00", "leased": 5}),
        # A later pass that leased nothing (an empty queue) does not move the stop.
        orjson.dumps({**pass_line, "ts": "2026-01-01T00:00:11.000+00:00", "leased": 0}),
    ]) + b"\n")
    (tmp_path / "reconciler-1.log").write_bytes(orjson.dumps(
        {**pass_line, "ts": "2026-01-01T00:00:10.500+00:00", "leased": 3}) + b"\n")
    last = 1767225610.5  # 2026-01-01T00:00:10.500Z
    tail = e2e._LogTail([tmp_path / "reconciler-0.log", tmp_path / "reconciler-1.log"])
    try:
        assert tail.poll() == 8 and tail.last_at == last
        # Noticed 41 ms after the last pass logged: the clock stops 40 ms before the notice.
        assert tail.stopped(100.0, last + 0.041, 8) == pytest.approx(99.96)
        # The logs do not account for every lease, or the wall clock moved: the notice counts.
        assert tail.stopped(100.0, last + 0.041, 9) == 100.0
        assert tail.stopped(100.0, last + 60.0, 8) == 100.0
    finally:
        tail.close()


def test_chart_is_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    results = [
        {"pools": p, "reconcilers": r, "tasks": 200, "placementsPerSec": 100.0 * r,
         "cpuBoundPlacementsPerSec": 150.0 * r}
        for p in (20, 40) for r in (1, 2)
    ]
    path = tmp_path / "img" / "chart.png"
    chart_write(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_tiny_run_leases_every_task_with_a_sound_ledger(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _tiny(server_url, 200, 2, "--floor-clients", "2", "--peer-clients", "2", "--json")
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1
    result = orjson.loads(lines[0])
    assert status == 0
    assert all(result.get(field) is not None for field in FIELDS), result
    assert (result["pools"], result["tasks"], result["reconcilers"]) == (20, 200, 2)
    assert result["leased"] == 200
    assert result["invariantsOk"], result["invariants"]
    assert result["passes"] >= 1
    assert result["p99LeaseMs"] >= result["p50LeaseMs"] > 0
    assert result["peakRssMiB"] > 0
    assert result["naiveTasks"] == 200 and result["naiveLeased"] == 200
    assert result["naiveInvariantsOk"]
    assert result["floorLeased"] == 200 and result["floorInvariantsOk"]
    assert result["floorUnplaced"] == 0 and result["floorCpuMsPerPlacement"] > 0
    assert result["fractionOfFloor"] == pytest.approx(
        result["placementsPerSec"] / result["floorPlacementsPerSec"], rel=0.01)
    # By construction the floor writes per task a subset of Berth's rows (no task events), and
    # each transaction's one sorted ledger update touches a pool at most once (how many pools
    # a batch touches depends on its size: the floor's 64 against Berth's claim per pass).
    berth, floor = result["rowWritesPerPlacement"], result["floorRowWritesPerPlacement"]
    assert set(berth) == set(floor) == set(e2e.WRITTEN)
    per_task = ("tasks", "task_events", "reservations", "leases")
    assert all(floor[t] <= berth[t] for t in per_task), (floor, berth)
    assert floor["task_events"] == 0 < berth["task_events"]
    assert floor["leases"] == floor["reservations"] == floor["tasks"] == 1.0
    assert 0 < floor["ledgers"] <= 1.0
    # The minimal floor, on its own tables: every task leased exactly once, no ledger over.
    assert result["minimalFloorLeased"] == 200 and result["minimalFloorUnplaced"] == 0
    assert result["minimalFloorInvariantsOk"], result["minimalFloorInvariants"]
    assert set(result["minimalFloorInvariants"]) >= {"ledger_over_total", "task_not_leased_once"}
    assert (result["minimalFloorClients"], result["minimalFloorBatch"]) == (2, 64)
    assert result["minimalFloorCpuMsPerPlacement"] > 0
    assert result["fractionOfMinimalFloor"] == pytest.approx(
        result["placementsPerSec"] / result["minimalFloorPlacementsPerSec"], rel=0.01)
    if result["peer"] is not None:
        assert result["peer"].startswith("pgqueuer") and result["peerJobsPerSec"] > 0
        # Rounded to two decimals, as ratioVsNaive.
        assert result["ratioVsPeer"] == pytest.approx(
            result["placementsPerSec"] / result["peerJobsPerSec"], abs=0.006)
    else:
        assert result["ratioVsPeer"] is None
    # The phases on stderr (plain lines: stderr is not a terminal here), with counts.
    for phase in ("placing ...", "placing  200/200 leased", "naive baseline  200/200 placed",
                  "SQL floor  200/200 placed", "minimal SQL floor  200/200 placed"):
        assert f"berth bench e2e: {phase}" in err, err


def test_mixes_add_ten_percent_of_their_kind_and_leave_the_default_alone() -> None:
    plain = dataset_generate(pools=20, tasks=1000, seed=3)
    assert dataset_generate(pools=20, tasks=1000, seed=3, mix="default").tasks == plain.tasks
    anti = dataset_generate(pools=20, tasks=1000, seed=3, mix="antiaffinity")
    pool_kind, domain_kind = anti.kinds["antiAffinityPool"], anti.kinds["antiAffinityFailureDomain"]
    assert 60 <= pool_kind + domain_kind <= 140 and pool_kind > 20 and domain_kind > 20
    carried: dict[str, set[str]] = {}
    for row in anti.tasks:
        carried.setdefault(row[2], set()).add(orjson.loads(row[7]).get("app", ""))
    for row in anti.tasks:
        spec = orjson.loads(row[6])
        for term in spec["affinity"]["required"]:
            # A required anti-affinity term whose selector other tasks of the tenant carry,
            # and which no anti-affine task carries itself.
            assert term["anti"] and term["topology"] in ("pool", "failureDomain")
            assert term["selector"]["app"] in carried[row[2]]
            assert not term["selector"]["app"].startswith("anti-")
    with pytest.raises(ValueError, match="mix"):
        dataset_generate(pools=20, tasks=10, mix="chaos")
    gangs = dataset_generate(pools=20, tasks=1000, seed=3, mix="gangs")
    assert 90 <= gangs.kinds["gang"] <= 160
    assert {orjson.loads(r[6])["gang"]["members"] for r in gangs.tasks
            if orjson.loads(r[6])["gang"]} <= {2, 3, 4}


def test_bad_bench_options_are_refused() -> None:
    for argv, message in ((["--floor-clients", "0"], "--floor-clients"),
                          (["--floor-batch", "0"], "--floor-batch"),
                          (["--finished", "-1"], "--finished"),
                          (["--profile-out", "p", "--sweep", "pools=10"], "--profile-out"),
                          (["--repeat", "0"], "--repeat"),
                          (["--repeat", "2", "--profile-out", "p"], "not a --repeat"),
                          (["--repeat", "2", "--records-out", "r.json"], "not a --repeat")):
        with pytest.raises(SystemExit, match=message):
            e2e.main(argv)
    with pytest.raises(SystemExit):
        e2e.main(["--mix", "chaos"])


@pytest.mark.slow
def test_tiny_run_with_history_and_a_mix(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _tiny(server_url, 300, 2, "--skip-naive", "--skip-floor", "--skip-minimal-floor",
                   "--skip-peer", "--mix", "antiaffinity", "--finished", "3000")
    # Without --json: a short table of the headline figures, no baseline rows when skipped.
    title, *rows = capsys.readouterr().out.strip().splitlines()
    assert status == 0
    assert title.startswith("berth bench e2e: 20 pools, 300 tasks, 2 reconcilers; PostgreSQL ")
    figures = {name: value for name, value in (row.strip().split("  ", 1) for row in rows)}
    assert list(figures) == ["placements per second", "lease latency p50 / p99",
                             "CPU per placement", "tasks leased", "peak reconciler memory"]
    assert figures["tasks leased"].strip() == "300 of 300; ledger invariants hold"
    assert float(figures["placements per second"].replace(",", "")) > 0


def test_repeat_summary_gives_each_figure_its_median_and_range() -> None:
    runs = [{"placementsPerSec": rate, "cpuMsPerPlacement": cpu, "ratioVsNaive": naive,
             "fractionOfMinimalFloor": None}
            for rate, cpu, naive in ((9000.0, 0.15, 12.0), (15000.0, 0.12, 17.0),
                                     (11000.0, 0.2, None))]
    summary = e2e.repeat_summary(runs)
    assert (summary["summary"], summary["runs"]) == ("repeat", 3)
    assert summary["placementsPerSec"] == {"median": 11000.0, "min": 9000.0, "max": 15000.0}
    assert summary["cpuMsPerPlacement"] == {"median": 0.15, "min": 0.12, "max": 0.2}
    # A mean of two medians prints as its inputs do, not 0.28500000000000003.
    assert e2e.repeat_summary([{"cpuMsPerPlacement": 0.274}, {"cpuMsPerPlacement": 0.296}])[
        "cpuMsPerPlacement"]["median"] == 0.285
    # A figure some runs lack (a baseline that failed to run) is summarized over the others.
    assert summary["ratioVsNaive"] == {"median": 14.5, "min": 12.0, "max": 17.0}
    # A skipped baseline (or a figure no run has) has no summary.
    assert summary["fractionOfMinimalFloor"] is None and summary["ratioVsPeer"] is None
    assert set(summary) == {"summary", "runs", *e2e.REPEATED}


def test_repeated_runs_are_each_printed_then_summarized(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _tiny(server_url, 100, 1, "--skip-naive", "--skip-floor", "--skip-peer",
                   "--floor-clients", "2", "--repeat", "2", "--json")
    out, err = capsys.readouterr()
    *runs, summary = [orjson.loads(line) for line in out.strip().splitlines()]
    assert status == 0 and len(runs) == 2
    assert all(r["leased"] == 100 and r["invariantsOk"] for r in runs)
    assert summary["runs"] == 2
    for key in ("placementsPerSec", "fractionOfMinimalFloor"):
        values = sorted(r[key] for r in runs)
        assert summary[key] == {"median": round(sum(values) / 2, 6), "min": values[0],
                                "max": values[1]}
    assert summary["ratioVsNaive"] is None and summary["fractionOfFloor"] is None
    assert "berth bench e2e: [run 2/2] placing" in err, err


def test_headline_and_sweep_rows_show_each_baseline_beside_berth() -> None:
    result = {
        "placementsPerSec": 6000.0, "p50LeaseMs": 900.0, "p99LeaseMs": 1500.0,
        "cpuMsPerPlacement": 0.12, "leased": 20000, "tasks": 20000, "invariantsOk": True,
        "peakRssMiB": 90.0, "naivePlacementsPerSec": 600.0, "ratioVsNaive": 10.0,
        "floorPlacementsPerSec": 12000.0, "fractionOfFloor": 0.5,
        "minimalFloorPlacementsPerSec": 24000.0, "fractionOfMinimalFloor": 0.25,
        "peerJobsPerSec": 5000.0, "peer": "pgqueuer 1.6.0, 4 consumers, batch 64",
        "ratioVsPeer": 1.2, "pools": 1000, "reconcilers": 2, "quotas": False,
    }
    rows = dict(e2e._headline(result))
    assert rows["SQL floor"] == "12,000.0 placements/s (Berth: 50 % of it)"
    assert rows["minimal SQL floor"] == "24,000.0 placements/s (Berth: 25 % of it)"
    assert rows["peer queue"].endswith("(pgqueuer 1.6.0, 4 consumers, batch 64; Berth: 1.2x)")
    assert e2e._sweep_row(result)[1].endswith("25 % of minimal floor")
    skipped = {**result, "fractionOfMinimalFloor": None, "minimalFloorPlacementsPerSec": None}
    assert "minimal" not in e2e._sweep_row(skipped)[1]
    assert "minimal SQL floor" not in dict(e2e._headline(skipped))


async def test_minimal_floor_places_every_task_once_and_its_check_sees_breakage(
    server_url: str,
) -> None:
    import asyncio

    import asyncpg

    from bench.database import database_create, database_drop, database_name
    from bench.minimal_floor import (
        minimal_floor_check,
        minimal_floor_prepare,
        minimal_floor_run,
    )

    ds = dataset_generate(pools=8, tasks=150, seed=4, mix="gangs")
    url = await database_create(server_url, prefix="berth_test_minimal", migrate=False)
    try:
        await minimal_floor_prepare(url, ds)
        result = await asyncio.to_thread(minimal_floor_run, url, database_name(url),
                                         clients=2, batch=16)
        checked = await minimal_floor_check(url)
        assert (result.placed, result.unplaced, checked["leased"]) == (150, 0, 150)
        assert not any(checked["invariants"].values()), checked
        conn = await asyncpg.connect(url)
        try:
            # A second lease for one task, another task back to waiting, a ledger over.
            await conn.execute("INSERT INTO leases (task_id, pool_id, expires_at) "
                               "SELECT task_id, pool_id, expires_at FROM leases WHERE task_id = 0")
            await conn.execute("UPDATE tasks SET leased_at = NULL WHERE id = 1")
            await conn.execute("UPDATE ledgers SET cpu_reserved = cpu_total + 1 WHERE pool_id = "
                               "(SELECT min(pool_id) FROM ledgers)")
        finally:
            await conn.close()
        broken = (await minimal_floor_check(url))["invariants"]
    finally:
        await database_drop(server_url, url)
    assert broken["task_not_leased_once"] == 2 and broken["ledger_over_total"] == 1
    # The doubled lease and the over-committed ledger both leave ledgers off their leases.
    assert broken["reserved_not_sum_of_leases"] >= 1


async def test_history_is_loaded_as_the_lifecycle_leaves_it(server_url: str) -> None:
    from datetime import UTC, datetime

    import asyncpg

    from bench.database import database_create, database_drop
    from bench.dataset import dataset_load
    from bench.history import history_load

    ds = dataset_generate(pools=8, tasks=50, seed=2)
    url = await database_create(server_url)
    try:
        await dataset_load(url, ds, now=datetime.now(UTC))
        await history_load(url, ds, finished=1000, now=datetime.now(UTC))
        conn = await asyncpg.connect(url)
        try:
            states = dict(await conn.fetch("SELECT state, count(*) FROM tasks GROUP BY 1"))
            leases = await conn.fetchval(
                "SELECT count(*) FROM leases WHERE state = 'COMPLETED' AND ended_at IS NOT NULL")
            events = await conn.fetchval("SELECT count(*) FROM task_events")
            queued = await conn.fetchval("SELECT coalesce(sum(queued), 0) FROM "
                                         "tenant_queue_counts")
            orphans = await conn.fetchval(
                "SELECT count(*) FROM leases l WHERE NOT EXISTS "
                "(SELECT 1 FROM tasks t WHERE t.id = l.task_id) OR NOT EXISTS "
                "(SELECT 1 FROM pools p WHERE p.id = l.pool_id)")
            reservations = await conn.fetchval("SELECT count(*) FROM reservations")
        finally:
            await conn.close()
    finally:
        await database_drop(server_url, url)
    assert states == {"SUCCEEDED": 800, "FAILED": 100, "CANCELLED": 100}
    assert leases == 900 and events == 900 * 3 + 100 * 2
    assert (queued, orphans, reservations) == (0, 0, 0)


async def test_a_late_bulk_heartbeat_wakes_reconcilers_as_the_endpoint_does(db) -> None:
    import asyncio

    from app.ledger.wakeups import CHANNEL
    from bench.dataset import runtimes_heartbeat

    heard: list[str] = []

    def listen(*args: object) -> None:
        heard.append(str(args[3]))

    async with db.connection() as conn:
        await conn.execute("INSERT INTO runtime_instances (id, last_heartbeat_at) "
                           "VALUES ('fresh', now()), ('late', now() - interval '20 seconds')")
        await conn.add_listener(CHANNEL, listen)
        try:
            await runtimes_heartbeat(conn)  # 'late' had gone stale: pool_healthy, broad
            await runtimes_heartbeat(conn)  # nobody stale: no wakeup
            await conn.execute("SELECT pg_notify($1, 'marker')", CHANNEL)
            for _ in range(500):
                if "marker" in heard:
                    break
                await asyncio.sleep(0.01)
        finally:
            await conn.remove_listener(CHANNEL, listen)
    assert heard == ["pool_healthy", "marker"]


@pytest.mark.slow
def test_a_profiled_run_writes_its_phases_statements_and_index_entries(
    server_url: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profile"
    status = _tiny(server_url, 200, 1, "--skip-naive", "--skip-floor", "--skip-peer", "--json",
                   "--profile-out", str(out))
    assert status == 0
    result = orjson.loads(capsys.readouterr().out.strip().splitlines()[0])
    phases = result["passCpuUsPerPlacement"]
    assert phases["plan"] > 0 and phases["commit"] > 0 and phases["read"] > 0
    assert phases["total"] == pytest.approx(sum(v for k, v in phases.items() if k != "total"),
                                            abs=1.0)
    profile = result["profile"]
    statements = profile["statements"]
    if "unavailable" in statements:
        # A server that does not preload the extension is named, not fatal.
        assert "shared_preload_libraries" in statements["unavailable"]
    else:
        assert any("INSERT INTO leases" in s["query"] for s in statements["top"])
    # Each placement adds at least its lease's and its reservation's primary key entries.
    assert profile["indexEntries"]["leases.pk_leases"] >= 1.0
    assert profile["indexEntries"]["reservations.pk_reservations"] >= 1.0
    assert orjson.loads((out / "profile.json").read_bytes())["profile"] == profile
    table = (out / "profile.md").read_text()
    assert "| commit_build |" in table and "index entries per placement" in table
